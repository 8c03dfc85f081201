// The Hopper GEMM: out = epilogue(A . B^T), TMA + wgmma, warp-specialized and persistent.
//
// Block = 3 warpgroups, one per SM (4-stage ring 192 KB + output boxes 32 KB of shared
// memory), in clusters of 2 blocks that take vertically adjacent tiles (one-block clusters,
// a block loading all of B, when the output has a single tile row, M <= 128; clusters of a
// tile's 2-8 split pieces there when it splits):
//   warpgroup 0, the producer: one thread walks the block's tiles and, per 64-wide k
//     step, waits for a stage that both blocks' consumers released, then loads A
//     [128 x 64] by TMA and its half of B [256 x 64], multicast into both blocks
//     (128-byte swizzle), the bytes completing on the stage's `full` barrier.
//     It keeps 40 registers (setmaxnreg) and gives the rest to
//   warpgroups 1 and 2, the consumers: each owns 64 rows of the 128 x 256 tile and
//     issues four wgmma m64n256k16 per stage (128 fp32 accumulators per thread), keeps
//     one stage's MMAs in flight while the next stage's are issued, releases a stage
//     when the MMAs reading it are done, and at the end of a tile applies the epilogue
//     (bias, activation, residual), writes its 64 x 256 (silu_mul: 64 x 128) piece to
//     shared memory with stmatrix and stores it by TMA (store_tile.cuh), while the
//     producer already fills the ring for the next tile.
// Split-K: when the tiles are too few to fill the GPU (M = 33-256 rows against a projection,
// where 16-24 tiles left 85% of the SMs idle), each tile's k steps are cut into pieces. With
// one tile row the pieces of a tile are the blocks of one cluster (args.k_cluster, up to 8):
// each writes its fp32 sums into its drained ring and the cluster reduces them through
// distributed shared memory, each block finishing a slice of the tile's columns
// (gemm_sm90_cluster_reduce.cuh). Otherwise each piece is a unit of the walk whose consumers
// store their fp32 sums to a scratch buffer, and gemm_split_reduce_kernel
// (gemm_split_reduce.cuh) adds the pieces and applies the epilogue.
// Tiles (and pieces, a tile's pieces adjacent) run in the grouped raster order of
// tile_scheduler.h. K-major and MN-major operands differ only in their TMA boxes and
// descriptors, so the layouts the backward needs (B N-major for dX, A and B MN-major for dW)
// run the same loop.
// silu_mul: the B tile is the 128 gate rows j..j+127 and the 128 up rows n/2 + j.., so a
// thread holds each gate accumulator and its up partner (columns c and c + 128).
//
// Roofline (bf16, H100 SXM): 2MNK FLOPs at ~990 TFLOP/s dense peak (cuBLAS reaches
// ~700-750 on this box); per 128 x 256 x 64 stage the tensor cores need 4.2 M FLOPs =
// ~520 cycles at 8 K FLOPs/cycle/SM and the ring brings 48 KB, i.e. ~92 B/cycle/SM from
// L2, within what L2 sustains when the raster keeps panels resident. Versions and their
// numbers: docs/history/gemm.md.
#pragma once

#include <cuda.h>

#include "common/sm90/mbarrier.cuh"
#include "common/sm90/store_tile.cuh"
#include "common/sm90/tile_scheduler.h"
#include "common/sm90/tma.cuh"
#include "common/sm90/warpgroup.cuh"
#include "common/sm90/wgmma.cuh"
#include "gemm/gemm_epilogue.cuh"
#include "gemm/gemm_sm90_cluster_reduce.cuh"

namespace llmk::detail::sm90 {

struct GemmSm90Config {
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 256;  // columns of A.B^T per tile (silu_mul: 128 gate + 128 up)
  static constexpr int kBlockK = 64;   // one 128-byte swizzle row of 16-bit elements
  static constexpr int kStages = 4;
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = (1 + kConsumers) * kWarpgroupThreads;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static constexpr uint32_t kStageBytesA = kBlockM * kBlockK * 2;
  static constexpr uint32_t kStageBytesB = kBlockN * kBlockK * 2;
  static constexpr uint32_t kStageBytes = kStageBytesA + kStageBytesB;
  static constexpr int kRasterGroup = 8;  // in cluster tiles (2 x 128 rows)
  // Blocks per cluster: at most 2, vertically adjacent tiles (same B columns), each loading
  // its A and half of B, multicast to both. The launcher picks 1 (args.cluster) when the
  // output has one tile row: a second block would compute an empty tile.
  static constexpr int kMaxCluster = 2;
  // The most pieces of a split reduced inside a cluster (the portable cluster size).
  static constexpr int kMaxKCluster = 8;
  // Each consumer's output block goes out in 64 x 128 halves, two 64 x 64 TMA-store
  // boxes each (a 64 x 256 buffer would leave room for 3 stages only).
  static constexpr uint32_t kOutBytes = 64 * 128 * 2;
  // Ring + output buffers + barriers + slack to align the ring to 1024 bytes.
  static constexpr int kSharedBytes =
      kStages * kStageBytes + kConsumers * kOutBytes + (2 * kStages + kConsumers) * 8 + 1024;
  static_assert(kSharedBytes <= kMaxBlockSharedBytes, "the tile's shared memory exceeds sm_90's 227 KB");
};

struct GemmSm90Args {
  GemmParams p;
  bool tma_store;     // out rows TMA-addressable: store through map_out
  bool tma_residual;  // tma_store and the residual's rows too: load it through map_residual
  GroupedRaster raster;
  int64_t k_steps;
  int64_t n_tile;  // output columns per tile: 256, or 128 for silu_mul
  // Split-K (few tiles, long K): each tile's k steps in `splits` pieces of `split_steps`,
  // each piece a unit of work; with k_cluster == 1 its fp32 sums go to partial[split][row]
  // [col] (row pitch ld_partial) for gemm_split_reduce_kernel; splits 1: the epilogue in
  // this kernel.
  int64_t splits, split_steps, ld_partial;
  float* partial;
  int cluster;  // blocks per cluster sharing B (1 or kMaxCluster)
  // k_cluster > 1: the launch's clusters are a tile's `splits` pieces (cluster == 1, one
  // block a piece, one tile a cluster), reduced through distributed shared memory instead of
  // `partial`; 1: the launch's cluster dimension is `cluster`.
  int k_cluster;

  LLMK_HOST_DEVICE int64_t units() const { return raster.tiles() * splits; }
  // Unit u: tile u / splits, its k steps [unit_k_begin(u), + unit_steps(u)).
  LLMK_HOST_DEVICE int unit_k_begin(int64_t u) const { return static_cast<int>(u % splits * split_steps); }
  LLMK_HOST_DEVICE int unit_steps(int64_t u) const {
    const int64_t left = k_steps - u % splits * split_steps;
    return static_cast<int>(left < split_steps ? left : split_steps);
  }
};

// The producer's loads of k step `kt` of tile (m0, n0) into stage memory `a`, `b`: A
// alone, and this block's half of B (rank r: B rows 128r.. of the tile, silu_mul: the gate
// rows for rank 0 and the up rows for rank 1) multicast to both blocks of the cluster.
template <bool kAKMajor, bool kBKMajor>
__device__ __forceinline__ void gemm_sm90_load_stage(const CUtensorMap* map_a, const CUtensorMap* map_b,
                                                     uint8_t* a, uint8_t* b, uint64_t* full,
                                                     const GemmSm90Args& args, int64_t m0, int64_t n0,
                                                     int64_t kt, uint32_t rank) {
  using C = GemmSm90Config;
  constexpr uint16_t kAll = (1u << C::kMaxCluster) - 1;
  const int32_t k0 = static_cast<int32_t>(kt * C::kBlockK);
  mbarrier_arrive_expect_tx(full, C::kStageBytes);
  if constexpr (kAKMajor) {
    tma_load_2d(a, map_a, full, static_cast<int32_t>(m0), k0);
  } else {
#pragma unroll
    for (int c = 0; c < C::kBlockM / 64; ++c)
      tma_load_2d(a + c * 64 * C::kBlockK * 2, map_a, full, k0, static_cast<int32_t>(m0 + 64 * c));
  }
  // B in two halves of 128 rows (K-major) or columns (N-major), half h loaded by rank
  // h % cluster; silu_mul: the gate rows, then the up rows.
  const bool multicast = args.cluster > 1;
  const bool silu = args.p.activation == GemmActivation::silu_mul;
#pragma unroll
  for (int h = static_cast<int>(rank); h < 2; h += args.cluster) {
    const int64_t first = silu ? (h == 0 ? n0 : args.p.n / 2 + n0) : n0 + 128 * h;
    uint8_t* half = b + h * 128 * C::kBlockK * 2;
    auto load = [&](uint8_t* dst, int32_t row, int32_t col) {
      if (multicast) tma_load_2d_multicast(dst, map_b, full, row, col, kAll);
      else tma_load_2d(dst, map_b, full, row, col);
    };
    if constexpr (kBKMajor) {
      load(half, static_cast<int32_t>(first), k0);
    } else {
#pragma unroll
      for (int c = 0; c < 2; ++c) load(half + c * 64 * C::kBlockK * 2, k0, static_cast<int32_t>(first + 64 * c));
    }
  }
}

// The epilogue math in place: d becomes act(d + bias) (+ residual from global memory when
// `residual`; the TMA path adds it from shared memory instead), in the accumulator layout
// (d[4j + 2h + e] at row row0 + 8h, column col0 + 8j + 2(lane%4) + e). silu_mul leaves its
// 64 x 128 result in d[0, 64) (gate j with up j + 16, columns 8j..).
template <class TOut, GemmActivation Act>
__device__ __forceinline__ void gemm_sm90_finish(const GemmParams& p, float (&d)[128], int64_t row0, int64_t col0,
                                                 bool residual) {
  const int64_t n_out = p.n_out();
  constexpr int kPairs = Act == GemmActivation::silu_mul ? 16 : 32;
  const TOut* bias = static_cast<const TOut*>(p.bias);
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const int64_t col = col0 + 8 * j + 2 * (threadIdx.x % 4);
    // The bias pair of this column (and its up partner), loaded once for both rows.
    float bg[2] = {0.f, 0.f}, bu[2] = {0.f, 0.f};
    if (bias) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (col + e < n_out) {
          bg[e] = to_float(bias[col + e]);
          if constexpr (Act == GemmActivation::silu_mul) bu[e] = to_float(bias[n_out + col + e]);
        }
      }
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = 4 * j + 2 * h + e;
        float v;
        if constexpr (Act == GemmActivation::silu_mul) v = gemm_silu_mul(d[i] + bg[e], d[i + 64] + bu[e]);
        else v = gemm_activate<Act>(d[i] + bg[e]);
        const int64_t row = row0 + 8 * h;
        if (residual && col + e < n_out && row < p.m) v += gemm_residual_at<TOut>(p, row, col + e);
        d[i] = v;
      }
    }
  }
}

// A split-K piece: its fp32 sums as they are into split `split`'s slice of the partial sums
// (rows below m, columns below n), for gemm_split_reduce_kernel to add up and finish.
__device__ __forceinline__ void gemm_sm90_store_partial(const GemmSm90Args& args, const float (&d)[128], int64_t row0,
                                                        int64_t col0, int64_t split) {
  float* slice = args.partial + split * args.p.m * args.ld_partial;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int64_t col = col0 + 8 * j + 2 * (threadIdx.x % 4);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + 8 * h;
      if (row >= args.p.m || col >= args.p.n) continue;
      // ld_partial is a multiple of 4 and col even: the pair is 8-byte aligned.
      *reinterpret_cast<float2*>(slice + row * args.ld_partial + col) =
          make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
    }
  }
}

template <class TOut>
__device__ __forceinline__ void gemm_sm90_finish_dispatch(const GemmParams& p, float (&d)[128], int64_t row0,
                                                          int64_t col0, bool residual) {
  switch (p.activation) {
    case GemmActivation::none: return gemm_sm90_finish<TOut, GemmActivation::none>(p, d, row0, col0, residual);
    case GemmActivation::silu_mul:
      return gemm_sm90_finish<TOut, GemmActivation::silu_mul>(p, d, row0, col0, residual);
    case GemmActivation::gelu: return gemm_sm90_finish<TOut, GemmActivation::gelu>(p, d, row0, col0, residual);
    case GemmActivation::gelu_tanh:
      return gemm_sm90_finish<TOut, GemmActivation::gelu_tanh>(p, d, row0, col0, residual);
  }
}

// Stores the finished values straight from registers (outputs whose rows TMA cannot
// address: a row stride or pointer not 16-byte aligned).
template <class TOut>
__device__ __forceinline__ void gemm_sm90_store_direct(const GemmParams& p, const float (&d)[128], int64_t row0,
                                                       int64_t col0, int pairs) {
  const int64_t n_out = p.n_out();
  const bool vector_ok = p.ld_out % 2 == 0 && reinterpret_cast<uintptr_t>(p.out) % (2 * sizeof(TOut)) == 0;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int64_t col = col0 + 8 * j + 2 * (threadIdx.x % 4);
    if (j >= pairs) break;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + 8 * h;
      if (row >= p.m || col >= n_out) continue;
      TOut* out = static_cast<TOut*>(p.out) + row * p.ld_out + col;
      const float v0 = d[4 * j + 2 * h], v1 = d[4 * j + 2 * h + 1];
      if (vector_ok && col + 1 < n_out) {
        *reinterpret_cast<uint32_t*>(out) = ptx::pack2<TOut>(v0, v1);
      } else {
        out[0] = from_float<TOut>(v0);
        if (col + 1 < n_out) out[1] = from_float<TOut>(v1);
      }
    }
  }
}

// T: the input and output element type (__half or __nv_bfloat16).
template <class T, bool kAKMajor, bool kBKMajor>
__global__ void __launch_bounds__(GemmSm90Config::kThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                     const __grid_constant__ CUtensorMap map_out, const __grid_constant__ CUtensorMap map_residual,
                     const GemmSm90Args args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = GemmSm90Config;
  extern __shared__ uint8_t shared_raw[];
  uint8_t* ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(shared_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* out_boxes = ring + C::kStages * C::kStageBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(out_boxes + C::kConsumers * C::kOutBytes);
  uint64_t* empty = full + C::kStages;
  uint64_t* residual_loaded = empty + C::kStages;  // one per consumer
  auto stage_a = [&](int s) { return ring + s * C::kStageBytes; };
  auto stage_b = [&](int s) { return ring + s * C::kStageBytes + C::kStageBytesA; };

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], C::kConsumers * args.cluster);
    }
    for (int c = 0; c < C::kConsumers; ++c) mbarrier_init(&residual_loaded[c], 1);
    mbarrier_init_fence();
  }
  // The peer block multicasts into this block's ring: its barriers must exist first.
  cluster_sync();
  // The block's place among the cluster's tiles (B multicast); a k-cluster's blocks share one.
  const uint32_t rank = args.k_cluster > 1 ? 0u : cluster_rank();
  const int64_t first_tile = blockIdx.x / args.cluster, tile_step = gridDim.x / args.cluster;

  const int wg = warpgroup_index();
  if (wg == 0) {
    warpgroup_release_registers<C::kProducerRegs>();
    if (threadIdx.x == 0) {
      tma_prefetch_map(&map_a);
      tma_prefetch_map(&map_b);
      RingState<C::kStages> ring_state;
      for (int64_t u = first_tile; u < args.units(); u += tile_step) {
        const TileCoord tile = args.raster.at(u / args.splits);
        const int64_t m0 = (tile.row * args.cluster + rank) * C::kBlockM, n0 = tile.col * args.n_tile;
        const int k_begin = args.unit_k_begin(u), k_end = k_begin + args.unit_steps(u);
        for (int kt = k_begin; kt < k_end; ++kt) {
          mbarrier_wait(&empty[ring_state.stage], ring_state.phase ^ 1u);
          gemm_sm90_load_stage<kAKMajor, kBKMajor>(&map_a, &map_b, stage_a(ring_state.stage),
                                                   stage_b(ring_state.stage), &full[ring_state.stage], args, m0,
                                                   n0, kt, rank);
          ring_state.advance();
        }
      }
    }
    if (args.k_cluster > 1) cluster_sync();  // the consumers' barrier before their reduction
  } else {
    warpgroup_claim_registers<C::kConsumerRegs>();
    const int consumer = wg - 1;
    const bool leader = threadIdx.x % kWarpgroupThreads == 0;
    const int64_t n_out = args.p.n_out();
    const int out_cols = args.p.activation == GemmActivation::silu_mul ? C::kBlockN / 2 : C::kBlockN;
    uint8_t* my_out = out_boxes + consumer * C::kOutBytes;
    uint32_t residual_phase = 0;
    float d[128];
    RingState<C::kStages> ring_state;
    // A stage is released to both blocks' producers (both multicast into it); without
    // multicast to this block's own.
    auto release = [&](int s) {
      if (!leader) return;
      if (args.cluster == 1) return mbarrier_arrive(&empty[s]);
      for (int r = 0; r < args.cluster; ++r) mbarrier_arrive_cluster(&empty[s], static_cast<uint32_t>(r));
    };
    for (int64_t u = first_tile; u < args.units(); u += tile_step) {
      const TileCoord tile = args.raster.at(u / args.splits);
      const int steps = args.unit_steps(u);
      int previous = -1;
      for (int i = 0; i < steps; ++i) {
        const int s = ring_state.stage;
        mbarrier_wait(&full[s], ring_state.phase);
        const uint32_t a_addr = static_cast<uint32_t>(__cvta_generic_to_shared(stage_a(s))) +
                                consumer * 64 * C::kBlockK * 2;
        const uint32_t b_addr = static_cast<uint32_t>(__cvta_generic_to_shared(stage_b(s)));
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < C::kBlockK / 16; ++ks) {
          wgmma_m64n256k16<kAKMajor ? 0 : 1, kBKMajor ? 0 : 1>(
              WgmmaTag<T>{}, d, tile_descriptor<kAKMajor>(a_addr, ks, 64 * C::kBlockK * 2),
              tile_descriptor<kBKMajor>(b_addr, ks, 64 * C::kBlockK * 2), i > 0 || ks > 0);
        }
        wgmma_commit();
        wgmma_wait<1>();
        if (previous >= 0) release(previous);
        previous = s;
        ring_state.advance();
      }
      wgmma_wait<0>();
      wgmma_fence_operands(d);
      if (previous >= 0) release(previous);

      const int64_t row0 = (tile.row * args.cluster + rank) * C::kBlockM + consumer * 64;
      const int64_t col0 = tile.col * args.n_tile;
      const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
      if (args.k_cluster > 1) {
        gemm_sm90_reduce_in_cluster<C, T>(args.p, args.k_cluster, d, ring, consumer, row0 - consumer * 64, col0);
        continue;
      }
      if (args.splits > 1) {
        gemm_sm90_store_partial(args, d, row0 + 16 * warp + lane / 4, col0, u % args.splits);
        continue;
      }
      gemm_sm90_finish_dispatch<T>(args.p, d, row0 + 16 * warp + lane / 4, col0,
                                   args.p.residual != nullptr && !args.tma_residual);
      if (args.tma_store) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (h * 128 >= out_cols) break;
          // The previous stores must have read the buffer before it is rewritten.
          if (leader) tma_store_wait_read();
          named_barrier_sync(1 + consumer, kWarpgroupThreads);
          const uint32_t boxes = static_cast<uint32_t>(__cvta_generic_to_shared(my_out));
          if (args.tma_residual) {
            // The residual's 64 x 128 half into the box (coalesced, by TMA), added from there.
            if (leader) {
              mbarrier_arrive_expect_tx(&residual_loaded[consumer], C::kOutBytes);
              for (int b = 0; b < 2; ++b)
                tma_load_2d(my_out + b * 8192, &map_residual, &residual_loaded[consumer], static_cast<int32_t>(row0),
                            static_cast<int32_t>(col0 + 128 * h + 64 * b));
            }
            mbarrier_wait(&residual_loaded[consumer], residual_phase);
            residual_phase ^= 1u;
            add_swizzled<T, 128>(boxes, d + 64 * h);
          }
          store_accumulators_swizzled<T, 128>(boxes, d + 64 * h);
          fence_async_shared();
          named_barrier_sync(1 + consumer, kWarpgroupThreads);
          const int64_t col = col0 + 128 * h;
          if (leader && row0 < args.p.m) {
            for (int b = 0; b < 2 && col + 64 * b < n_out; ++b)
              tma_store_2d(&map_out, my_out + b * 8192, static_cast<int32_t>(row0), static_cast<int32_t>(col + 64 * b));
            tma_store_commit();
          }
        }
      } else {
        gemm_sm90_store_direct<T>(args.p, d, row0 + 16 * warp + lane / 4, col0, out_cols / 8);
      }
    }
    if (leader) tma_store_wait_read();
  }
  // The peer may still arrive on this block's barriers: both leave together.
  cluster_sync();
#endif
}

}  // namespace llmk::detail::sm90
