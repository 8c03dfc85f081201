// all_reduce_add_rmsnorm's kernels: an all-reduce over peer buffers with the residual add and
// the RMSNorm in the same launch, one launch per rank:
//   residual += sum over ranks of x;   x = residual * rsqrt(mean(residual^2) + eps) * (offset + w)
//
// Every rank launches the same grid of kPeerBlocks blocks; block b owns rows b, b +
// kPeerBlocks, ... (the same rows on every rank).
//
// The data are their own flags (the "Lamport" exchange). A message slot's empty state is a
// mark no value sent ever holds: every 16-bit half 0x8000 (f16 / bf16 -0.0; an f32 word
// 0x80008000, -2^-134). A sender stores its vectors into a peer's slot with plain 16-byte
// stores over NVLink, after mapping a value equal to the mark to a neighbour (f16 / bf16 -0.0
// to +0.0, which changes no sum: the sums start at +0.0f; the f32 word 0x80008000 to the next
// float toward zero, 2^-149 away); the receiver polls each vector of its own slot (volatile
// 16-byte loads, through L2 where the NVLink stores land) until none of its elements holds
// the mark, and stores the mark back (the slot is empty for its next use). So a vector costs
// one NVLink write's latency: no fence, no flag, no block barrier.
//
// Sends: up to kSpreadRows rows, every block sends an even share of the call's vectors (one
// SM's NVLink stores are slow); above, each block its own rows (see RowBlock::for_each_share).
// One-shot (all_reduce_add_rmsnorm_kernel): x goes to slot [parity][rank] of every rank's
// buffer (its own included); block b then sums each of its rows' ranks in fp32 in rank order
// (all polled from its own slots), rounds (the all-reduce's result), adds
// the residual and rounds (the new residual), reduces the sum of squares over the block and
// writes x. Each rank sends (w - 1) x the message.
// Two-shot (all_reduce_add_rmsnorm_two_shot_kernel): the row's vectors split into w chunks,
// rank s owning chunk s. Chunk s of x goes to slot [parity][rank] of rank s; block b sums
// this rank's chunk of its rows over the ranks as they arrive, rounds, and stores the sum into the
// gather slot [parity] of every rank (its own included), then adds and normalizes the whole
// rows as its gather slot fills. Each rank sends 2 (w - 1) / w x the message: half of
// one-shot's at 4 ranks, for a second NVLink latency.
// Both round the same sum the same way (a sum equal to the mark mapped as above, as sent), so
// every rank, on either kernel, leaves the same bits.
// A thread's first vectors of the block's first row stay in registers (kAllReduceKept: a row
// of up to 1024 vectors whole): its residual and weight, loaded before the first poll.
//
// Slots and ordering. The call count c is kept per block in this rank's buffer; every rank
// makes the same calls with the same grid, so the counts agree. Its parity picks the slots: a
// rank that pushes call c + 1's rows while a peer still reads call c's writes the other
// parity. It cannot get two calls ahead: to start call c + 2 it finished call c + 1, whose
// row 0 needed each peer's call c + 1 data (directly, or through the gather), sent after that
// peer's whole call-c kernel (its stores of the mark included) finished; so the mark a
// receiver stores into a slot always lands before the slot's next data. Blocks without rows
// send their share (up to kSpreadRows rows) and count the call, so every block's count stays
// the number of calls (either kernel's). So every rank must make the same calls (same rows,
// d, dtype and kernel), in stream order: a mismatched call leaves data nobody reads, which a
// later call would take for its own. A peer that never sends (a rank skipped a call) would
// hang the kernel: after the call's timeout (p.timeout_ticks, LLMK_ALL_REDUCE_TIMEOUT_S) the
// lowest waiting lane of each warp prints the ranks and the block and the kernel traps.
//
// Roofline (bf16, t rows of d, world w): the message is t * d * 2 bytes per rank; one-shot
// sends (w - 1) x it out of each GPU over NVLink (and receives as much), two-shot 2 (w - 1) / w
// x; locally x, the residual (read, written), x's output and the marks stored back. At decode
// sizes (t <= 128, d = 8192: <= 2 MiB) the time is the launch and one or two NVLink write
// latencies (~1 us each); from about 1 MiB at 4 ranks one-shot's 3 x the message is the
// bound (~200 GB/s out of a GPU measured), where two-shot's 1.5 x is not.
#pragma once

#include <cstdint>
#include <cstdio>

#include "common/device_types.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "distributed/all_reduce_params.h"

namespace llmk::detail {

// The global timer in ticks of 2^20 ns (~1 ms; 32 bits span 52 days), for the waits' timeout.
__device__ __forceinline__ uint32_t coarse_clock() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return static_cast<uint32_t>(t >> 20);
}

// A slot's empty mark, as 32-bit words (see the header).
inline constexpr uint32_t kEmptyWord = 0x80008000u;

// Whether a word of a polled vector still holds (part of) the mark.
template <class T>
__device__ __forceinline__ bool empty_word(uint32_t w) {
  if constexpr (sizeof(T) == 4) return w == kEmptyWord;
  else return (w & 0xffffu) == 0x8000u || (w >> 16) == 0x8000u;
}

// v as sent: an element equal to the mark mapped to its neighbour (see the header).
template <class T, int N>
__device__ __forceinline__ Vec<T, N> sendable(Vec<T, N> v) {
  static_assert(sizeof(Vec<T, N>) == 16, "messages move in 16-byte vectors");
  uint32_t* w = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (sizeof(T) == 4) {
      if (w[k] == kEmptyWord) w[k] = kEmptyWord - 1u;
    } else {
      if ((w[k] & 0xffffu) == 0x8000u) w[k] &= 0xffff0000u;
      if ((w[k] >> 16) == 0x8000u) w[k] &= 0x0000ffffu;
    }
  }
  return v;
}

__device__ __forceinline__ uint4 load_volatile(const uint4* at) {
  uint4 raw;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(raw.x), "=r"(raw.y), "=r"(raw.z), "=r"(raw.w)
               : "l"(at)
               : "memory");
  return raw;
}

template <class T>
__device__ __forceinline__ bool holds_mark(const uint4& raw) {
  return empty_word<T>(raw.x) || empty_word<T>(raw.y) || empty_word<T>(raw.z) || empty_word<T>(raw.w);
}

// Polls a vector of this rank's slot that `peer` sends in this call until none of its elements
// holds the mark (raw: its first load). A peer that does not send within the timeout stops the
// kernel with a message.
template <class T>
__device__ __forceinline__ void wait_while_marked(uint4& raw, const uint4* at, const AllReduceNormParams& p,
                                                  int peer, uint32_t call) {
  if (!holds_mark<T>(raw)) return;
  const uint32_t start = coarse_clock();
  do {
    if (coarse_clock() - start > p.timeout_ticks) {
      const unsigned lane = threadIdx.x % 32;
      if ((__activemask() & ((1u << lane) - 1u)) == 0) {  // one line per warp
        const unsigned ms = static_cast<unsigned>((uint64_t{p.timeout_ticks} << 20) / 1000000u);
        if (peer == p.rank)
          printf("llmk all_reduce_add_rmsnorm: rank %d waited %u ms for its own sends (block %d, call %u): the "
                 "kernel's 128 blocks could not all run\n", p.rank, ms, static_cast<int>(blockIdx.x), call);
        else
          printf("llmk all_reduce_add_rmsnorm: rank %d waited %u ms for rank %d (block %d, call %u): every rank "
                 "must make the same calls\n", p.rank, ms, peer, static_cast<int>(blockIdx.x), call);
      }
      __trap();
    }
    raw = load_volatile(at);
  } while (holds_mark<T>(raw));
}

__device__ __forceinline__ void store_mark(uint4* at) { *at = make_uint4(kEmptyWord, kEmptyWord, kEmptyWord, kEmptyWord); }

// One vector from each of the group's ranks (slot(r): where rank r's lands in this rank's
// buffer): the first loads of up to four ranks issued before any is waited on (eight would
// spill), then each polled until it arrives and its slot marked empty again.
template <class T, int N, int kMaxWorld, class Slot>
__device__ __forceinline__ void receive_ranks(Vec<T, N> (&parts)[kMaxWorld], Slot&& slot, const AllReduceNormParams& p,
                                              uint32_t call) {
  constexpr int kBatch = kMaxWorld < 4 ? kMaxWorld : 4;
#pragma unroll
  for (int first = 0; first < kMaxWorld; first += kBatch) {
    uint4 raw[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (first + k < p.world) raw[k] = load_volatile(reinterpret_cast<const uint4*>(slot(first + k)));
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (first + k < p.world) {
        uint4* at = reinterpret_cast<uint4*>(slot(first + k));
        wait_while_marked<T>(raw[k], at, p, first + k, call);
        store_mark(at);
        parts[first + k] = *reinterpret_cast<const Vec<T, N>*>(&raw[k]);
      }
  }
}

// One vector that `peer` sends in this call (see receive_ranks).
template <class T, int N>
__device__ __forceinline__ Vec<T, N> receive(T* slot, const AllReduceNormParams& p, int peer, uint32_t call) {
  uint4* at = reinterpret_cast<uint4*>(slot);
  uint4 raw = load_volatile(at);
  wait_while_marked<T>(raw, at, p, peer, call);
  store_mark(at);
  return *reinterpret_cast<const Vec<T, N>*>(&raw);
}

// Calls of up to this many rows spread their sends over every block (see for_each_share).
inline constexpr int kSpreadRows = 16;

// Threads per block and the vectors of a row each thread keeps in registers: rows of up to
// 1024 16-byte vectors (8192 bf16) are held whole, 1024 threads of one vector for two ranks,
// 512 of two for more (their per-rank values take the registers).
template <int kMaxWorld>
inline constexpr int kAllReduceThreads = kMaxWorld <= 2 ? 1024 : 512;
template <int kMaxWorld>
inline constexpr int kAllReduceKept = 1024 / kAllReduceThreads<kMaxWorld>;

// The weights of a vector of T, as stored (an f32 weight beside 16-bit rows: two loads).
template <class W, int N>
__device__ __forceinline__ Vec<W, N> load_weights(const W* p) {
  constexpr int kPer = kVec16<W>;
  Vec<W, N> w;
#pragma unroll
  for (int i = 0; i < N; i += kPer) {
    const Vec<W, kPer> part = load_vec<W, kPer>(p + i);
#pragma unroll
    for (int j = 0; j < kPer; ++j) w.v[i + j] = part.v[j];
  }
  return w;
}

// A block's view of the call: its call count, the slots of the count's parity, the row walk
// (vector v = base + i * blockDim, base = threadIdx.x + j * kKept * blockDim) and the
// registers of the thread's first vectors of the block's first row (kept).
template <class T, class W, int kKept>
struct RowBlock {
  static constexpr int N = kVec16<T>;
  using V = Vec<T, N>;
  using WV = Vec<W, N>;
  const AllReduceNormParams& p;
  uint32_t call;
  int64_t vecs, step, parity;
  V res_kept[kKept];
  WV w_kept[kKept];

  __device__ explicit RowBlock(const AllReduceNormParams& params) : p(params) {
    call = counts()[blockIdx.x] + 1;
    vecs = p.d / N;
    step = int64_t{kKept} * blockDim.x;
    parity = call & 1;
  }
  __device__ uint32_t* counts() const { return reinterpret_cast<uint32_t*>(p.buffers[p.rank] + kPeerCountsOffset); }
  // Every thread read the count (the constructor) before thread 0 stores the next one.
  __device__ void count_call() const {
    __syncthreads();
    if (threadIdx.x == 0) counts()[blockIdx.x] = call;
  }
  // Row `row` of message slot `slot` (0..2w-1: [parity][source]; 2w, 2w+1: the gather slots)
  // of `buffer`.
  __device__ T* slot_row(uint8_t* buffer, int64_t slot, int64_t row) const {
    return reinterpret_cast<T*>(buffer + kPeerDataOffset + slot * p.capacity) + row * p.d;
  }
  __device__ T* scatter_row(uint8_t* buffer, int source, int64_t row) const {
    return slot_row(buffer, parity * p.world + source, row);
  }
  __device__ T* gather_row(uint8_t* buffer, int64_t row) const { return slot_row(buffer, 2 * p.world + parity, row); }
  __device__ bool kept(int64_t row, int64_t base) const { return row == blockIdx.x && base == threadIdx.x; }

  // f(row, v) over the vectors this block sends. Up to kSpreadRows rows (decode): all rows'
  // vectors (row-major) in even contiguous shares over every block, so that every SM sends a
  // little (one SM's stores over NVLink flow at only ~7-10 GB/s); a row's block never
  // overwrites x before every share of its row was read: it waits for this rank's own part,
  // sent with the others'. Its waiting blocks are then the first p.rows, and the rest only
  // send and exit, so the call needs p.rows + 1 blocks resident at once. Above
  // it, each block sends its own rows (every block may wait; none waits for another block of
  // its rank: the call runs however few of the 128 blocks fit at once, 108 on an A100).
  template <class F>
  __device__ void for_each_share(F&& f) const {
    if (p.rows > kSpreadRows) {
      for (int64_t row = blockIdx.x; row < p.rows; row += kPeerBlocks)
        for (int64_t v = threadIdx.x; v < vecs; v += blockDim.x) f(row, v);
      return;
    }
    const int64_t vectors = p.rows * vecs, share = (vectors + kPeerBlocks - 1) / kPeerBlocks;
    const int64_t end = min(vectors, (blockIdx.x + 1) * share);
    for (int64_t i = blockIdx.x * share + threadIdx.x; i < end; i += blockDim.x) {
      const int64_t row = i / vecs;
      f(row, i - row * vecs);
    }
  }

  // f(row, v, i, kept) over every vector of the block's rows.
  template <class F>
  __device__ void for_each_vector(int64_t row, F&& f) const {
    for (int64_t base = threadIdx.x; base < vecs; base += step)
#pragma unroll
      for (int i = 0; i < kKept; ++i) {
        const int64_t v = base + i * blockDim.x;
        if (v >= vecs) break;
        f(v, i, kept(row, base));
      }
  }

  // The block's first row's residual and weight, into registers (before the first wait).
  __device__ void load_kept() {
#pragma unroll
    for (int i = 0; i < kKept; ++i) {
      const int64_t v = threadIdx.x + i * blockDim.x;
      if (v < vecs) {
        res_kept[i] = load_vec<T, N>(static_cast<const T*>(p.residual) + blockIdx.x * p.residual_stride + v * N);
        w_kept[i] = load_weights<W, N>(static_cast<const W*>(p.weight) + v * N);
      }
    }
  }

  // residual += sum; x = rmsnorm(residual) on row `row`, sum(v) giving the row's all-reduced
  // vector v (rounded to T).
  template <class Sum>
  __device__ void add_norm_row(int64_t row, Sum&& sum) {
    T* x = static_cast<T*>(p.x) + row * p.d;
    T* residual = static_cast<T*>(p.residual) + row * p.residual_stride;
    float sum_squares = 0.0f;
    for_each_vector(row, [&](int64_t v, int i, bool is_kept) {
      const V total = sum(v);
      V res = is_kept ? res_kept[i] : load_vec<T, N>(residual + v * N);
#pragma unroll
      for (int j = 0; j < N; ++j) {
        res.v[j] = from_float<T>(to_float(total.v[j]) + to_float(res.v[j]));
        const float rounded = to_float(res.v[j]);
        sum_squares += rounded * rounded;
      }
      store_vec(residual + v * N, res);
      if (is_kept) res_kept[i] = res;
    });
    const float rstd = rsqrtf(block_sum(sum_squares) / static_cast<float>(p.d) + p.eps);
    for_each_vector(row, [&](int64_t v, int i, bool is_kept) {
      const V res = is_kept ? res_kept[i] : load_vec<T, N>(residual + v * N);
      const WV w = is_kept ? w_kept[i] : load_weights<W, N>(static_cast<const W*>(p.weight) + v * N);
      V out;
#pragma unroll
      for (int j = 0; j < N; ++j) out.v[j] = from_float<T>(to_float(res.v[j]) * rstd * (p.offset + to_float(w.v[j])));
      store_vec(x + v * N, out);
    });
  }
};

// The ranks' vectors summed in fp32 in rank order, rounded to T, as sent (see the header).
template <class T, int N, int kMaxWorld>
__device__ __forceinline__ Vec<T, N> rank_sum(const Vec<T, N> (&parts)[kMaxWorld], int world) {
  Vec<T, N> out;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    float total = 0.0f;
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r)
      if (r < world) total += to_float(parts[r].v[j]);
    out.v[j] = from_float<T>(total);
  }
  return sendable(out);
}

// kMaxWorld: a bound on p.world (2, 4 or 8), so the per-rank loops unroll.
template <class T, class W, int kMaxWorld>
__global__ void __launch_bounds__(kAllReduceThreads<kMaxWorld>) all_reduce_add_rmsnorm_kernel(
    const AllReduceNormParams p) {
  RowBlock<T, W, kAllReduceKept<kMaxWorld>> b(p);
  using V = typename decltype(b)::V;
  constexpr int N = decltype(b)::N;
  // Send: x to every rank's slot [parity][rank], this rank's own included.
  b.for_each_share([&](int64_t row, int64_t v) {
    const V value = sendable(load_vec<T, N>(static_cast<const T*>(p.x) + row * p.d + v * N));
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r)
      if (r < p.world) store_vec(b.scatter_row(p.buffers[r], p.rank, row) + v * N, value);
  });
  if (blockIdx.x < p.rows) {
    b.load_kept();
    for (int64_t row = blockIdx.x; row < p.rows; row += kPeerBlocks)
      b.add_norm_row(row, [&](int64_t v) {
        V parts[kMaxWorld];
        receive_ranks<T, N, kMaxWorld>(parts, [&](int r) { return b.scatter_row(p.buffers[p.rank], r, row) + v * N; },
                                       p, b.call);
        return rank_sum<T, N, kMaxWorld>(parts, p.world);
      });
  }
  b.count_call();
}

template <class T, class W, int kMaxWorld>
__global__ void __launch_bounds__(kAllReduceThreads<kMaxWorld>) all_reduce_add_rmsnorm_two_shot_kernel(
    const AllReduceNormParams p) {
  RowBlock<T, W, kAllReduceKept<kMaxWorld>> b(p);
  using V = typename decltype(b)::V;
  constexpr int N = decltype(b)::N;
  const int64_t chunk = (b.vecs + p.world - 1) / p.world;  // vectors; rank s owns [s * chunk, (s + 1) * chunk)
  // Scatter: chunk s of x's rows to rank s's slot [parity][rank] (this rank's own included).
  b.for_each_share([&](int64_t row, int64_t v) {
    store_vec(b.scatter_row(p.buffers[v / chunk], p.rank, row) + v * N,
              sendable(load_vec<T, N>(static_cast<const T*>(p.x) + row * p.d + v * N)));
  });
  if (blockIdx.x < p.rows) {
    b.load_kept();
    // Reduce this rank's chunk as it arrives; its sum to every rank's gather slot.
    const int64_t first = p.rank * chunk, last = first + chunk < b.vecs ? first + chunk : b.vecs;
    for (int64_t row = blockIdx.x; row < p.rows; row += kPeerBlocks) {
      for (int64_t v = first + threadIdx.x; v < last; v += blockDim.x) {
        V parts[kMaxWorld];
        receive_ranks<T, N, kMaxWorld>(parts, [&](int r) { return b.scatter_row(p.buffers[p.rank], r, row) + v * N; },
                                       p, b.call);
        const V total = rank_sum<T, N, kMaxWorld>(parts, p.world);
#pragma unroll
        for (int r = 0; r < kMaxWorld; ++r)
          if (r < p.world) store_vec(b.gather_row(p.buffers[r], row) + v * N, total);
      }
    }
    for (int64_t row = blockIdx.x; row < p.rows; row += kPeerBlocks)
      b.add_norm_row(row, [&](int64_t v) {
        return receive<T, N>(b.gather_row(p.buffers[p.rank], row) + v * N, p, static_cast<int>(v / chunk), b.call);
      });
  }
  b.count_call();
}

}  // namespace llmk::detail
