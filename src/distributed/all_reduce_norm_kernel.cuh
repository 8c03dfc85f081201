// all_reduce_add_rmsnorm's kernel: a one-shot all-reduce over peer buffers with the residual
// add and the RMSNorm in the same pass, one launch per rank:
//   residual += sum over ranks of x;   x = residual * rsqrt(mean(residual^2) + eps) * (offset + w)
//
// Algorithm. Every rank launches the same grid of kPeerBlocks blocks; block b owns rows b,
// b + kPeerBlocks, ... (the same rows on every rank).
//  1. Push: block b reads its rows of x and stores them (16-byte stores over NVLink) into
//     slot [parity][rank] of every other rank's buffer.
//  2. Signal: after a barrier, thread r (r != rank) stores the block's call count c into flag
//     [b][rank] of rank r's buffer, a release at system scope (the block's rows are visible
//     to rank r before the flag), then spins on this rank's flag [b][r] until it reaches c
//     (an acquire): rank r's block b has pushed the same rows here. A barrier releases the block.
//  3. Reduce: per row, the ranks' values summed in fp32 in rank order (this rank's from x, the
//     others' from this rank's own slots, read through L2), rounded to T (the all-reduce's
//     result), added to the residual and rounded (stored: the new residual), the sum of
//     squares reduced over the block; then a second pass over the residual writes x. A thread's
//     first vector of the row stays in registers throughout (its x from the push, its residual
//     and weight loaded before the wait); other vectors are re-read.
// Slots and ordering. The call count c is kept per block in this rank's buffer; every rank
// makes the same calls with the same grid, so the counts agree. Its parity picks the slots: a
// rank that pushes call c + 1's rows while a peer still reads call c's writes the other
// parity. It cannot get two calls ahead: to start call c + 2 it finished call c + 1, whose
// block 0 (every call has a row 0) waited for the peer's block 0 of call c + 1, which started
// after the peer's whole call-c kernel finished. Blocks without rows skip steps 1-3 and only
// count the call, so every block's count stays the number of calls. A peer may be one call
// ahead, so a flag may already hold c + 1: the wait compares c - flag <= 0 (wrapping).
// A peer that never arrives (a rank skipped a call) would hang the kernel: after
// kPeerWaitSeconds it prints the ranks and the block and traps.
//
// Roofline (bf16, t rows of d, world w): per rank (w - 1) * t * d * 2 bytes out over NVLink
// and as many in, + x, residual (read and written) and x's output locally: at decode sizes
// (t <= 128, d = 8192: <= 2 MiB per rank) latency-bound: one NVLink write and one flag round
// trip (~1-2 us each) plus the launch, where the unfused NCCL all-reduce + add_rmsnorm_ pays
// NCCL's protocol steps and a second launch.
#pragma once

#include <cstdint>
#include <cstdio>

#include "common/device_types.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "distributed/all_reduce_params.h"

namespace llmk::detail {

inline constexpr unsigned long long kPeerWaitSeconds = 60;

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

// Spins until *flag has reached `call` (rank `peer`'s block has pushed its rows).
__device__ __forceinline__ void wait_for_peer(const uint32_t* flag, uint32_t call, int peer, int rank) {
  const unsigned long long start = global_ns();
  while (static_cast<int32_t>(call - load_acquire_sys(flag)) > 0) {
    if (global_ns() - start > kPeerWaitSeconds * 1000000000ull) {
      printf("llmk all_reduce_add_rmsnorm: rank %d waited %llu s for rank %d (block %d, call %u): every rank "
             "must make the same calls\n", rank, kPeerWaitSeconds, peer, static_cast<int>(blockIdx.x), call);
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

// kMaxWorld: a bound on p.world (2, 4 or 8), so the per-rank loops unroll. A row is walked in
// steps of kKept * blockDim vectors, vector v = step + i * blockDim + threadIdx.x; the block's
// first row's first step stays in registers: its x (loaded for the push), and its residual and
// weight, loaded before the wait for the peers; so after the wait a decode row costs one round
// trip to L2 (the peers' values) and none more. Longer rows re-read their other vectors.
template <class T, class W, int kMaxWorld>
__global__ void __launch_bounds__(kAllReduceThreads<kMaxWorld>) all_reduce_add_rmsnorm_kernel(
    const AllReduceNormParams p) {
  constexpr int N = kVec16<T>;
  constexpr int kKept = kAllReduceKept<kMaxWorld>;
  using V = Vec<T, N>;
  using WV = Vec<W, N>;
  const int block = static_cast<int>(blockIdx.x);
  uint8_t* const own = p.buffers[p.rank];
  uint32_t* const counts = reinterpret_cast<uint32_t*>(own + kPeerCountsOffset);
  const uint32_t call = counts[block] + 1;
  const int64_t vecs = p.d / N;
  const int64_t step = int64_t{kKept} * blockDim.x;
  const int64_t first_slot = static_cast<int64_t>(call & 1) * p.world;  // [parity][0]
  auto slot_row = [&](const uint8_t* buffer, int source, int64_t row) {
    return reinterpret_cast<T*>(const_cast<uint8_t*>(buffer) + kPeerDataOffset + (first_slot + source) * p.capacity) +
           row * p.d;
  };
  const W* weight = static_cast<const W*>(p.weight);

  if (block < p.rows) {
    // 1. Push this rank's rows into every peer's slot [parity][rank].
    V mine[kKept] = {};
    for (int64_t row = block; row < p.rows; row += kPeerBlocks) {
      const T* x = static_cast<const T*>(p.x) + row * p.d;
      for (int64_t base = threadIdx.x; base < vecs; base += step)
#pragma unroll
        for (int i = 0; i < kKept; ++i) {
          const int64_t v = base + i * blockDim.x;
          if (v >= vecs) break;
          const V value = load_vec<T, N>(x + v * N);
#pragma unroll
          for (int r = 0; r < kMaxWorld; ++r)
            if (r < p.world && r != p.rank) store_vec(slot_row(p.buffers[r], p.rank, row) + v * N, value);
          if (row == block && base == threadIdx.x) mine[i] = value;
        }
    }
    V res_kept[kKept] = {};
    WV w_kept[kKept] = {};
#pragma unroll
    for (int i = 0; i < kKept; ++i) {
      const int64_t v = threadIdx.x + i * blockDim.x;
      if (v < vecs) {
        res_kept[i] = load_vec<T, N>(static_cast<const T*>(p.residual) + block * p.residual_stride + v * N);
        w_kept[i] = load_weights<W, N>(weight + v * N);
      }
    }
    __syncthreads();
    // 2. Tell each peer, wait for each peer.
    const int peer = static_cast<int>(threadIdx.x);
    if (peer < p.world && peer != p.rank) {
      uint32_t* const peer_flags = reinterpret_cast<uint32_t*>(p.buffers[peer] + kPeerFlagsOffset);
      store_release_sys(peer_flags + block * kPeerMaxRanks + p.rank, call);
      const uint32_t* const own_flags = reinterpret_cast<const uint32_t*>(own + kPeerFlagsOffset);
      wait_for_peer(own_flags + block * kPeerMaxRanks + peer, call, peer, p.rank);
    }
    __syncthreads();
    // 3. Sum in rank order, add, normalize.
    for (int64_t row = block; row < p.rows; row += kPeerBlocks) {
      T* x = static_cast<T*>(p.x) + row * p.d;
      T* residual = static_cast<T*>(p.residual) + row * p.residual_stride;
      float sum_squares = 0.0f;
      for (int64_t base = threadIdx.x; base < vecs; base += step) {
        const bool is_kept = row == block && base == threadIdx.x;
#pragma unroll
        for (int i = 0; i < kKept; ++i) {
          const int64_t v = base + i * blockDim.x;
          if (v >= vecs) break;
          V parts[kMaxWorld];
#pragma unroll
          for (int r = 0; r < kMaxWorld; ++r)
            if (r < p.world)
              parts[r] = r != p.rank ? load_slot<T, N>(slot_row(own, r, row) + v * N)
                         : is_kept   ? mine[i]
                                     : load_vec<T, N>(x + v * N);
          V res = is_kept ? res_kept[i] : load_vec<T, N>(residual + v * N);
#pragma unroll
          for (int j = 0; j < N; ++j) {
            float total = 0.0f;
#pragma unroll
            for (int r = 0; r < kMaxWorld; ++r)
              if (r < p.world) total += to_float(parts[r].v[j]);
            res.v[j] = from_float<T>(to_float(from_float<T>(total)) + to_float(res.v[j]));
            const float rounded = to_float(res.v[j]);
            sum_squares += rounded * rounded;
          }
          store_vec(residual + v * N, res);
          if (is_kept) res_kept[i] = res;
        }
      }
      const float rstd = rsqrtf(block_sum(sum_squares) / static_cast<float>(p.d) + p.eps);
      for (int64_t base = threadIdx.x; base < vecs; base += step) {
        const bool is_kept = row == block && base == threadIdx.x;
#pragma unroll
        for (int i = 0; i < kKept; ++i) {
          const int64_t v = base + i * blockDim.x;
          if (v >= vecs) break;
          const V res = is_kept ? res_kept[i] : load_vec<T, N>(residual + v * N);
          const WV w = is_kept ? w_kept[i] : load_weights<W, N>(weight + v * N);
          V out;
#pragma unroll
          for (int j = 0; j < N; ++j)
            out.v[j] = from_float<T>(to_float(res.v[j]) * rstd * (p.offset + to_float(w.v[j])));
          store_vec(x + v * N, out);
        }
      }
    }
  }
  if (threadIdx.x == 0) counts[block] = call;
}

}  // namespace llmk::detail
