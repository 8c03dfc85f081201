// The Hopper GEMM's split-K reduced inside a thread-block cluster (gemm_sm90_kernel.cuh): a
// one-tile-row call's tile split into args.k_cluster pieces, one block each, whose fp32 sums
// meet through distributed shared memory: no partial sums in global memory, no second kernel.
//
// Each consumer writes its 64 x 256 sums (the rows below m) row-major into its block's ring,
// drained by then, with kClusterSumsLd floats per row; a cluster barrier publishes them; block
// r then adds its slice of the tile's column quads, [64 r / S, 64 (r + 1) / S), over every row
// below m, each float4 over the cluster's blocks in rank order (the order of
// gemm_split_reduce_kernel: the same bits), and applies the epilogue of gemm_epilogue.cuh.
// Roofline: S x 128 KB of shared-memory traffic per tile at most, ~1-2 us beside the pieces'
// weight stream; the kernel's last cluster barrier keeps every ring alive for the reads.
// gemm_sm90_cluster_reduce_slice also serves the quantized Hopper kernel's split.
#pragma once

#include <cstdint>

#include "common/device_types.cuh"
#include "common/sm90/mbarrier.cuh"
#include "common/sm90/warpgroup.cuh"
#include "gemm/gemm.h"
#include "gemm/gemm_epilogue.cuh"

namespace llmk::detail::sm90 {

// The float4 at shared offset `local` of block `rank` of the cluster.
__device__ __forceinline__ float4 ld_shared_cluster_f4(uint32_t local, uint32_t rank) {
  float4 v;
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %4, %5;\n"
      "ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [remote];\n}\n"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
      : "r"(local), "r"(rank)
      : "memory");
  return v;
}

// Row stride (floats) of a piece's sums in shared memory, for the kernel's config C: 8 floats
// of padding put the 8 rows a warp's float2 stores touch on distinct banks.
template <class C>
inline constexpr int kClusterSumsLd = C::kBlockN + 8;

// Block `rank`'s share of a k-cluster reduction: columns [4 q_begin, 4 q_end) of `rows` rows
// of sums (kLd floats apart; row r is output row row0 + r, column c output column col0 + c);
// each float4 is added over the cluster's first `pieces` blocks (at most kMaxPieces) in rank
// order (the order of gemm_split_reduce_kernel: the same bits), then gemm_store_four's
// epilogue. Also the quantized Hopper kernel's reduction (quantized_sm90_kernel.cuh).
template <int kLd, int kMaxPieces, class TOut, GemmActivation Act>
__device__ __forceinline__ void gemm_sm90_cluster_reduce_slice(const GemmParams& p, uint32_t sums, int pieces, int rows,
                                                               int q_begin, int q_end, int64_t row0, int64_t col0,
                                                               int thread, int threads) {
  const int quads = q_end - q_begin;
  for (int item = thread; item < rows * quads; item += threads) {
    const int row = item / quads, col = 4 * (q_begin + item % quads);
    const uint32_t at = sums + static_cast<uint32_t>(row * kLd + col) * 4;
    float4 v[kMaxPieces];
#pragma unroll
    for (int r = 0; r < kMaxPieces; ++r)
      if (r < pieces) v[r] = ld_shared_cluster_f4(at, static_cast<uint32_t>(r));
    float acc[4] = {v[0].x, v[0].y, v[0].z, v[0].w};
#pragma unroll
    for (int r = 1; r < kMaxPieces; ++r) {
      if (r >= pieces) break;
      acc[0] += v[r].x;
      acc[1] += v[r].y;
      acc[2] += v[r].z;
      acc[3] += v[r].w;
    }
    gemm_store_four<TOut, Act>(p, row0 + row, col0 + col, acc);
  }
}

// The reduction of one tile split into `pieces` blocks (see above), called by the consumer
// threads (256) with their accumulators d of rows tile_row0 + 64 consumer.., columns col0...
template <class C, class T>
__device__ __forceinline__ void gemm_sm90_reduce_in_cluster(const GemmParams& p, int pieces, const float (&d)[128],
                                                            uint8_t* ring, int consumer, int64_t tile_row0,
                                                            int64_t col0) {
  static_assert(C::kBlockM * kClusterSumsLd<C> * 4 <= C::kStages * C::kStageBytes, "a piece's sums must fit the ring");
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const int rows = static_cast<int>(p.m - tile_row0 < C::kBlockM ? p.m - tile_row0 : C::kBlockM);
  float* sums = reinterpret_cast<float*>(ring);
  // Both consumers' MMAs have read their last stage before either overwrites the ring.
  named_barrier_sync(3, C::kConsumers * kWarpgroupThreads);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = consumer * 64 + 16 * warp + lane / 4 + 8 * h;
    if (row >= rows) continue;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      *reinterpret_cast<float2*>(sums + row * kClusterSumsLd<C> + 8 * j + 2 * (lane % 4)) =
          make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
  }
  cluster_sync();
  const int r = static_cast<int>(cluster_rank());
  constexpr int kQuads = C::kBlockN / 4;
  const int q_begin = kQuads * r / pieces, q_end = kQuads * (r + 1) / pieces;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(sums));
  const int thread = static_cast<int>(threadIdx.x) - kWarpgroupThreads, threads = C::kConsumers * kWarpgroupThreads;
  switch (p.activation) {
    case GemmActivation::gelu:
      return gemm_sm90_cluster_reduce_slice<kClusterSumsLd<C>, C::kMaxKCluster, T, GemmActivation::gelu>(
          p, base, pieces, rows, q_begin, q_end, tile_row0, col0, thread, threads);
    case GemmActivation::gelu_tanh:
      return gemm_sm90_cluster_reduce_slice<kClusterSumsLd<C>, C::kMaxKCluster, T, GemmActivation::gelu_tanh>(
          p, base, pieces, rows, q_begin, q_end, tile_row0, col0, thread, threads);
    default:  // none (silu_mul does not split)
      return gemm_sm90_cluster_reduce_slice<kClusterSumsLd<C>, C::kMaxKCluster, T, GemmActivation::none>(
          p, base, pieces, rows, q_begin, q_end, tile_row0, col0, thread, threads);
  }
}

}  // namespace llmk::detail::sm90
