// all_reduce_add_rmsnorm's kernels: an all-reduce over peer buffers with the residual add and
// the RMSNorm in the same launch, one launch per rank:
//   residual += sum over ranks of x;   x = residual * rsqrt(mean(residual^2) + eps) * (offset + w)
//
// Every rank launches the same grid of kPeerBlocks blocks; block b owns rows b, b +
// kPeerBlocks, ... (the same rows on every rank), and meets the same block of the other ranks
// at flags: after a barrier, thread r (r != rank) stores the block's call count c into flag
// [b][rank] of rank r's buffer, a release at system scope (what the block stored into rank r's
// buffer is visible before the flag), then spins on this rank's flag [b][r] until it reaches c
// (an acquire); a barrier releases the block.
//
// One-shot (all_reduce_add_rmsnorm_kernel): block b stores its rows of x into slot
// [parity][rank] of every other rank's buffer (16-byte stores over NVLink), meets the peers,
// then sums each row's ranks in fp32 in rank order (its own x, the others' from its own
// slots, read through L2), rounds (the all-reduce's result), adds the residual and rounds
// (the new residual), reduces the sum of squares over the block and writes x. Each rank sends
// (w - 1) x the message.
// Two-shot (all_reduce_add_rmsnorm_two_shot_kernel): the row's vectors split into w chunks,
// rank s owning chunk s. Block b stores chunk s of its rows into slot [parity][rank] of rank
// s, meets the peers (flags A), sums its own chunk over the ranks, rounds, and stores the sum
// into the gather slot [parity] of every rank (its own included), meets the peers again
// (flags B), then adds and normalizes the whole rows from its gather slot. Each rank sends 2
// (w - 1) / w x the message: half of one-shot's at 4 ranks, for one more flag round trip.
// Both round the same sum the same way, so every rank, on either kernel, leaves the same bits.
// A thread's first vectors of the block's first row stay in registers (kAllReduceKept: a row
// of up to 1024 vectors whole): its residual and weight loaded before the first wait, and in
// one-shot its x from the push; so after the peers arrive a decode row costs one round trip
// to L2 per exchange.
//
// Slots and ordering. The call count c is kept per block in this rank's buffer; every rank
// makes the same calls with the same grid, so the counts agree. Its parity picks the slots: a
// rank that pushes call c + 1's rows while a peer still reads call c's writes the other
// parity. It cannot get two calls ahead: to start call c + 2 it finished call c + 1, whose
// block 0 (every call has a row 0) waited for the peer's block 0 of call c + 1, which started
// after the peer's whole call-c kernel finished. Blocks without rows only count the call, so
// every block's count stays the number of calls (either kernel's). A peer may be one call
// ahead, so a flag may already hold c + 1: the peer has arrived when the flag is c or c + 1.
// Any other value is an older call's (a block that had no rows for a while, or the gather
// flags through one-shot calls) and means not yet, however far back (no wrapping window).
// A peer that never arrives (a rank skipped a call) would hang the kernel: after the call's
// timeout (p.timeout_ns, LLMK_ALL_REDUCE_TIMEOUT_S) it prints the ranks and the block and traps.
//
// Roofline (bf16, t rows of d, world w): the message is t * d * 2 bytes per rank; one-shot
// sends (w - 1) x it out of each GPU over NVLink (and receives as much), two-shot 2 (w - 1) / w
// x; locally x, the residual (read, written) and x's output. At decode sizes (t <= 128, d =
// 8192: <= 2 MiB) the time is the launch and one or two NVLink write + flag round trips (~1-2
// us each); from about 1 MiB at 4 ranks one-shot's 3 x the message is the bound (~200 GB/s out
// of a GPU measured), where two-shot's 1.5 x is not.
#pragma once

#include <cstdint>
#include <cstdio>

#include "common/device_types.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "distributed/all_reduce_params.h"

namespace llmk::detail {

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

// Spins until *flag holds `call` or `call + 1` (rank `peer`'s block has pushed its rows).
__device__ __forceinline__ void wait_for_peer(const uint32_t* flag, uint32_t call, int peer, int rank,
                                              unsigned long long timeout_ns) {
  const unsigned long long start = global_ns();
  while (load_acquire_sys(flag) - call > 1u) {
    if (global_ns() - start > timeout_ns) {
      printf("llmk all_reduce_add_rmsnorm: rank %d waited %llu s for rank %d (block %d, call %u): every rank "
             "must make the same calls\n", rank, timeout_ns / 1000000000ull, peer, static_cast<int>(blockIdx.x),
             call);
      __trap();
    }
  }
}

// A 16-byte vector of a slot that peers wrote: through L2 (the point where their NVLink
// stores land), never a stale L1 line.
template <class T, int N>
__device__ __forceinline__ Vec<T, N> load_slot(const T* p) {
  static_assert(sizeof(Vec<T, N>) == 16, "slots are read in 16-byte vectors");
  const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(p));
  return *reinterpret_cast<const Vec<T, N>*>(&raw);
}

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

// Meets block blockIdx.x of every other rank at `flags_offset` (see above).
__device__ __forceinline__ void meet_peers(const AllReduceNormParams& p, size_t flags_offset, uint32_t call) {
  __syncthreads();
  const int peer = static_cast<int>(threadIdx.x);
  const int slot = static_cast<int>(blockIdx.x) * kPeerMaxRanks;
  if (peer < p.world && peer != p.rank) {
    store_release_sys(reinterpret_cast<uint32_t*>(p.buffers[peer] + flags_offset) + slot + p.rank, call);
    wait_for_peer(reinterpret_cast<const uint32_t*>(p.buffers[p.rank] + flags_offset) + slot + peer, call, peer,
                  p.rank, p.timeout_ns);
  }
  __syncthreads();
}

// A block's view of the call: its call count, the slots of the count's parity, the row walk
// (vector v = base + i * blockDim + threadIdx.x, bases step kKept * blockDim apart) and the
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
  __device__ void count_call() const {
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

  // residual += sum; x = rmsnorm(residual) on row `row`, sum(v, i, kept) giving the row's
  // all-reduced vector v (rounded to T).
  template <class Sum>
  __device__ void add_norm_row(int64_t row, Sum&& sum) {
    T* x = static_cast<T*>(p.x) + row * p.d;
    T* residual = static_cast<T*>(p.residual) + row * p.residual_stride;
    float sum_squares = 0.0f;
    for_each_vector(row, [&](int64_t v, int i, bool is_kept) {
      const V total = sum(v, i, is_kept);
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

// The ranks' vectors summed in fp32 in rank order, rounded to T.
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
  return out;
}

// kMaxWorld: a bound on p.world (2, 4 or 8), so the per-rank loops unroll.
template <class T, class W, int kMaxWorld>
__global__ void __launch_bounds__(kAllReduceThreads<kMaxWorld>) all_reduce_add_rmsnorm_kernel(
    const AllReduceNormParams p) {
  RowBlock<T, W, kAllReduceKept<kMaxWorld>> b(p);
  using V = typename decltype(b)::V;
  constexpr int N = decltype(b)::N;
  if (blockIdx.x < p.rows) {
    V mine[kAllReduceKept<kMaxWorld>] = {};
    for (int64_t row = blockIdx.x; row < p.rows; row += kPeerBlocks) {
      const T* x = static_cast<const T*>(p.x) + row * p.d;
      b.for_each_vector(row, [&](int64_t v, int i, bool is_kept) {
        const V value = load_vec<T, N>(x + v * N);
#pragma unroll
        for (int r = 0; r < kMaxWorld; ++r)
          if (r < p.world && r != p.rank) store_vec(b.scatter_row(p.buffers[r], p.rank, row) + v * N, value);
        if (is_kept) mine[i] = value;
      });
    }
    b.load_kept();
    meet_peers(p, kPeerFlagsOffset, b.call);
    for (int64_t row = blockIdx.x; row < p.rows; row += kPeerBlocks) {
      const T* x = static_cast<const T*>(p.x) + row * p.d;
      b.add_norm_row(row, [&](int64_t v, int i, bool is_kept) {
        V parts[kMaxWorld];
#pragma unroll
        for (int r = 0; r < kMaxWorld; ++r)
          if (r < p.world)
            parts[r] = r != p.rank ? load_slot<T, N>(b.scatter_row(p.buffers[p.rank], r, row) + v * N)
                       : is_kept   ? mine[i]
                                   : load_vec<T, N>(x + v * N);
        return rank_sum<T, N, kMaxWorld>(parts, p.world);
      });
    }
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
  if (blockIdx.x < p.rows) {
    // Scatter: chunk s of the block's rows to rank s.
    for (int64_t row = blockIdx.x; row < p.rows; row += kPeerBlocks) {
      const T* x = static_cast<const T*>(p.x) + row * p.d;
      b.for_each_vector(row, [&](int64_t v, int, bool) {
        const int owner = static_cast<int>(v / chunk);
        if (owner != p.rank) store_vec(b.scatter_row(p.buffers[owner], p.rank, row) + v * N, load_vec<T, N>(x + v * N));
      });
    }
    b.load_kept();
    meet_peers(p, kPeerFlagsOffset, b.call);
    // Reduce this rank's chunk; its sum to every rank's gather slot.
    const int64_t first = p.rank * chunk, last = first + chunk < b.vecs ? first + chunk : b.vecs;
    for (int64_t row = blockIdx.x; row < p.rows; row += kPeerBlocks) {
      const T* x = static_cast<const T*>(p.x) + row * p.d;
      for (int64_t v = first + threadIdx.x; v < last; v += blockDim.x) {
        V parts[kMaxWorld];
#pragma unroll
        for (int r = 0; r < kMaxWorld; ++r)
          if (r < p.world)
            parts[r] = r != p.rank ? load_slot<T, N>(b.scatter_row(p.buffers[p.rank], r, row) + v * N)
                                   : load_vec<T, N>(x + v * N);
        const V total = rank_sum<T, N, kMaxWorld>(parts, p.world);
#pragma unroll
        for (int r = 0; r < kMaxWorld; ++r)
          if (r < p.world) store_vec(b.gather_row(p.buffers[r], row) + v * N, total);
      }
    }
    meet_peers(p, kPeerGatherFlagsOffset, b.call);
    for (int64_t row = blockIdx.x; row < p.rows; row += kPeerBlocks)
      b.add_norm_row(row, [&](int64_t v, int, bool) {
        return load_slot<T, N>(b.gather_row(p.buffers[p.rank], row) + v * N);
      });
  }
  b.count_call();
}

}  // namespace llmk::detail
