// The Hopper kernel of quantized_gemm for int4 weights at 1-128 tokens (sm_90a): the weight
// as wgmma's register A operand, dequantized from shared memory, x as the shared B operand.
//
// out^T [N, M] = W [N, K] . x^T: a block owns kRows weight rows (two consumer warpgroups of
// kTiles m64 tiles: 256 rows at kTokens = 64, 128 at kTokens = 128, where a tile's fp32 sums
// take 64 registers) and all M tokens (kTokens: the wgmma N), over one piece of K.
//   * Producer (one thread of warpgroup 0): per 128 k (one 512-bit block of codes per row), a
//     stage of the ring holds the x tile [kTokens x 128 k] (two TMA boxes, 128-byte swizzle)
//     and the codes tile [kRows x 64 bytes] (one box, unswizzled).
//   * Consumers: a lane (g = lane / 4, t = lane % 4 of warp w) reads the 16 bytes of codes of
//     weight rows 16w + g and 16w + g + 8 of each tile: chunk i (word i) holds k = 32i + 8t ..
//     + 7 of its row (include/llmk/quantized_gemm.h), dequantized (dequant::dequant_int4: (q -
//     z) exactly, times the group's scale, one rounding) into four pairs, which are the A
//     fragments of two k16 steps s = 0, 1: (a0, a2) = pairs 2s and 2s + 1 of row g, (a1, a3)
//     the same of row g + 8, the mma.sync m16n8k16 A layout that wgmma's register operand
//     shares per warp. A k-reduction is invariant under a permutation applied to both operands,
//     so the mma's k of step (i, s), 8 hi + 2 t + e, is x's k 32 i + 8 t + 4 s + 2 hi + e:
//     quantized_permute_x_kernel writes x in that order once per call, and the TMA boxes of
//     that copy are B tiles as the dense GEMM's are (64 k per 128-byte row, k16 step S % 4 at
//     32 (S % 4) bytes of half S / 4).
//   * Per chunk a consumer issues 2 kTiles wgmma (tiles x 2 steps) on one of two register buffers,
//     then waits for the previous chunk's, so the next dequantization overlaps the mma; a
//     stage is released after the next stage's first chunk (the mma never drains per stage).
//   * Split-K over gridDim.x pieces, the blocks of one thread-block cluster (up to 8): each
//     block writes its fp32 sums [token][row] into its drained ring, a cluster barrier
//     publishes them, and block r adds the row quads [kRows r / 4S, kRows (r + 1) / 4S)
//     (rounded down) of every token over the cluster's blocks in rank order through
//     distributed shared memory, then applies the bias and stores (one kernel, no partial
//     sums in global memory; S = 1 is a cluster of one).
//   * Programmatic dependent launch: the codes of the first stages are requested before the
//     wait for the permute kernel (the codes and scales are not its outputs), x after it.
// Roofline (int4 g128): N K / 2 bytes of codes + N K / 64 of scales; x (M K 2 bytes) is read
// once per row block from L2; the reduction moves S x kRows x M x 4 bytes through shared
// memory. K4096 N14336: 29.4 MB, 6.9 us at the H200's 4.25 TB/s copy rate; the tensor work at
// M = 128 (15 GFLOP) is ~22 us at a dense 700 TFLOP/s. The consumers are issue-bound (Nsight
// Compute, docs/kernels/quantized_linear.md): ~15 instructions dequantize 8 codes, so the loop
// carries as little else as possible (scale offsets counted, not divided; shared loads).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/device_types.cuh"
#include "common/ptx.cuh"
#include "common/sm90/mbarrier.cuh"
#include "common/sm90/tma.cuh"
#include "common/sm90/warpgroup.cuh"
#include "common/sm90/wgmma.cuh"
#include "gemm/gemm.h"
#include "gemm/gemm_sm90_cluster_reduce.cuh"
#include "gemm/quantized.h"
#include "gemm/quantized_dequant.cuh"

namespace llmk::detail::sm90 {

template <int kTokens>
struct QuantSm90Config {
  // m64 tiles per consumer: two at 64 tokens, one at 128 (the fp32 sums, 64 registers a
  // tile at 128 tokens, must leave room for the fragments in 168 registers).
  static constexpr int kTiles = kTokens == 128 ? 1 : 2;
  static constexpr int kRows = 128 * kTiles;  // weight rows per block: 2 consumers x kTiles m64 tiles
  static constexpr int kBlockK = 128;         // k per stage: one 512-bit block of int4 codes per row
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = (1 + kConsumers) * kWarpgroupThreads;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static constexpr uint32_t kXHalfBytes = kTokens * 128;  // 64 k of every token
  static constexpr uint32_t kXBytes = 2 * kXHalfBytes;
  static constexpr uint32_t kCodeBytes = kRows * 64;  // 16 words per row
  static constexpr uint32_t kStageBytes = kXBytes + kCodeBytes;
  static constexpr int kStages = 225280 / kStageBytes;  // 5 (128 tokens) or 6 (64)
  static constexpr int kSharedBytes = kStages * kStageBytes + 2 * kStages * 8 + 1024;
  static constexpr int kMaxPieces = 8;  // a portable cluster
  // Row stride (floats) of a piece's sums [token][row] in the ring: 2 x (kRows + 4) = 8 (mod 32) banks
  // apart, so a warp's stores (8 rows x 4 token pairs) hit distinct banks.
  static constexpr int kSumsLd = kRows + 4;
  static_assert(kStageBytes % 1024 == 0, "each stage's tiles must stay 1024-byte aligned");
  static_assert(kTokens * kSumsLd * 4 <= kStages * kStageBytes, "a piece's sums must fit the ring");
};

struct QuantSm90Args {
  QuantizedParams p;
  GemmParams out;    // out [m, n], its row stride and the bias, for gemm_store_four
  int k_blocks;      // k / 128
  int piece_blocks;  // k blocks per piece (every piece non-empty)
};

// x [m, k] (row stride ldx) -> xp [m, k] (contiguous) in the mma's k order (see above). Grid
// (k / 2048 blocks, m rows) of 256 threads; a thread writes 8 consecutive elements (16 bytes)
// from four pairs 8 elements apart: element 2 t' + e of the 8 at k = 16 S' (S' = 2 i + s, its
// 16-element step) + 8 hi comes from k = 32 i + 8 t' + 4 s + 2 hi + e. Launched with PDL
// (common/pdl_launch.h).
template <class T>
__global__ void __launch_bounds__(256) quantized_permute_x_kernel(const T* x, int64_t ldx, T* xp, int64_t k) {
  ptx::pdl_start();
  const int64_t kp = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * 8;
  if (kp >= k) return;
  const int within = static_cast<int>(kp % 128), step = within / 16, hi = (within % 16) / 8;
  const T* src = x + int64_t{blockIdx.y} * ldx + (kp - within) + 32 * (step / 2) + 4 * (step % 2) + 2 * hi;
  uint4 v;
  v.x = *reinterpret_cast<const uint32_t*>(src);
  v.y = *reinterpret_cast<const uint32_t*>(src + 8);
  v.z = *reinterpret_cast<const uint32_t*>(src + 16);
  v.w = *reinterpret_cast<const uint32_t*>(src + 24);
  *reinterpret_cast<uint4*>(xp + int64_t{blockIdx.y} * k + kp) = v;
}

// wgmma m64 x kTokens x k16 with A from registers, B the K-major x tile.
template <class T, int kTokens>
__device__ __forceinline__ void quant_wgmma(float (&d)[kTokens / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (kTokens == 128) wgmma_m64n128k16_rs<0>(WgmmaTag<T>{}, d, a, desc_b, true);
  else wgmma_m64n64k16_rs<0>(WgmmaTag<T>{}, d, a, desc_b, true);
}

// Grid (pieces of K, row blocks of kRows) in clusters of gridDim.x blocks; block kThreads.
template <class T, int kTokens>
__global__ void __launch_bounds__(QuantSm90Config<kTokens>::kThreads, 1)
    quantized_sm90_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_codes,
                          const QuantSm90Args args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = QuantSm90Config<kTokens>;
  extern __shared__ uint8_t shared_raw[];
  // Offset from the array (not a cast of a rounded integer) so that reads through it stay
  // shared-memory loads, not generic ones.
  uint8_t* ring = shared_raw + ((1024u - static_cast<uint32_t>(__cvta_generic_to_shared(shared_raw)) % 1024u) % 1024u);
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + C::kStages * C::kStageBytes);
  uint64_t* empty = full + C::kStages;
  auto stage_x = [&](int s) { return ring + s * C::kStageBytes; };
  auto stage_codes = [&](int s) { return ring + s * C::kStageBytes + C::kXBytes; };

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], C::kConsumers * kWarpgroupThreads);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  const QuantizedParams& p = args.p;
  const int64_t row0 = int64_t{blockIdx.y} * C::kRows;
  const int kb_begin = static_cast<int>(blockIdx.x) * args.piece_blocks;
  const int kb_end = kb_begin + args.piece_blocks < args.k_blocks ? kb_begin + args.piece_blocks : args.k_blocks;

  const int wg = warpgroup_index();
  if (wg == 0) {
    warpgroup_release_registers<C::kProducerRegs>();
    if (threadIdx.x == 0) {
      tma_prefetch_map(&map_x);
      tma_prefetch_map(&map_codes);
      auto load_x = [&](int s, int kb) {
        tma_load_2d(stage_x(s), &map_x, &full[s], 0, kb * C::kBlockK);
        tma_load_2d(stage_x(s) + C::kXHalfBytes, &map_x, &full[s], 0, kb * C::kBlockK + 64);
      };
      // The first ring's codes before the wait for the permute kernel, their x after it.
      const int first = kb_end - kb_begin < C::kStages ? kb_end - kb_begin : C::kStages;
      for (int s = 0; s < first; ++s) {
        mbarrier_arrive_expect_tx(&full[s], C::kStageBytes);
        tma_load_2d(stage_codes(s), &map_codes, &full[s], static_cast<int32_t>(row0), (kb_begin + s) * 16);
      }
      ptx::wait_for_prior_grid();
      for (int s = 0; s < first; ++s) load_x(s, kb_begin + s);
      RingState<C::kStages> ring_state;
      for (int s = 0; s < first; ++s) ring_state.advance();
      for (int kb = kb_begin + first; kb < kb_end; ++kb) {
        const int s = ring_state.stage;
        mbarrier_wait(&empty[s], ring_state.phase ^ 1u);
        mbarrier_arrive_expect_tx(&full[s], C::kStageBytes);
        load_x(s, kb);
        tma_load_2d(stage_codes(s), &map_codes, &full[s], static_cast<int32_t>(row0), kb * 16);
        ring_state.advance();
      }
    }
    cluster_sync();  // the consumers' sums are published
    cluster_sync();  // every block's reads of them are done
    return;
  }
  warpgroup_claim_registers<C::kConsumerRegs>();
  const int consumer = wg - 1;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = (static_cast<int>(threadIdx.x) / 32) % 4;
  const int g = lane / 4, t = lane % 4;
  // This lane's weight rows: tile mt, half h (row g or g + 8 of its warp's 16), at
  // local_row(mt, h) of the block's kRows; their scales and zero points at element at_row[mt][h]
  // + group (32 bits: quantized_sm90_takes bounds n x groups), the rows clamped below n (a
  // row past n computes sums that are never stored).
  const int lrow = consumer * 64 * C::kTiles + 16 * warp + g;
  auto local_row = [&](int mt, int h) { return lrow + 64 * mt + 8 * h; };
  const int groups = static_cast<int>(p.k / p.group_size);
  const T* scales = static_cast<const T*>(p.scales);
  uint32_t at_row[C::kTiles][2];
#pragma unroll
  for (int mt = 0; mt < C::kTiles; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + local_row(mt, h);
      at_row[mt][h] = static_cast<uint32_t>((row < p.n ? row : p.n - 1) * groups);
    }
  const uint32_t zz_symmetric = dequant::zero_operand<T, 4>(8u);

  constexpr int kAcc = kTokens / 2;
  float acc[C::kTiles][kAcc];
#pragma unroll
  for (int mt = 0; mt < C::kTiles; ++mt)
#pragma unroll
    for (int e = 0; e < kAcc; ++e) acc[mt][e] = 0.0f;

  // Each row's scale (and zero point) of group `group`, loaded one stage ahead (a global read:
  // its latency then overlaps the previous stage's work). The group of the next stage is
  // tracked by counting (no division in the loop): k = 128 kb is `in_group` into `group`.
  auto load_group = [&](int group, T (&sv)[C::kTiles][2], uint32_t (&zv)[C::kTiles][2]) {
#pragma unroll
    for (int mt = 0; mt < C::kTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        sv[mt][h] = scales[at_row[mt][h] + group];
        zv[mt][h] = p.zeros ? p.zeros[at_row[mt][h] + group] : 8u;
      }
  };
  const int group_size = static_cast<int>(p.group_size);
  int group = static_cast<int>(int64_t{kb_begin} * C::kBlockK / group_size);
  int in_group = static_cast<int>(int64_t{kb_begin} * C::kBlockK % group_size);
  T next_scale[C::kTiles][2];
  uint32_t next_zero[C::kTiles][2];
  load_group(group, next_scale, next_zero);
  RingState<C::kStages> ring_state;
  // The stage whose x the last stage's mma may still read: released once the next stage's
  // first mma is issued and everything before it has completed (no drain per stage).
  int pending = -1;
  uint32_t a[2][C::kTiles][2][4];  // [buffer][tile][step][register], live across stages
  // Every consumer thread arrives (no barrier or leader branch inside the mma pipeline: ptxas
  // serializes the wgmma around those): the thread has read its codes, and its warp has seen
  // the mma that read x complete.
  auto release = [&](int stage) { mbarrier_arrive(&empty[stage]); };
  for (int kb = kb_begin; kb < kb_end; ++kb) {
    uint32_t ss[C::kTiles][2], zz[C::kTiles][2];
#pragma unroll
    for (int mt = 0; mt < C::kTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t su = *reinterpret_cast<const unsigned short*>(&next_scale[mt][h]);
        ss[mt][h] = su | (su << 16);
        zz[mt][h] = p.zeros ? dequant::zero_operand<T, 4>(next_zero[mt][h]) : zz_symmetric;
      }
    in_group += C::kBlockK;
    if (in_group == group_size) {
      in_group = 0;
      ++group;
    }
    load_group(group < groups ? group : groups - 1, next_scale, next_zero);  // past the end: unused
    const int s = ring_state.stage;
    mbarrier_wait(&full[s], ring_state.phase);
    // The codes tile: 64-byte rows, unswizzled (a quarter warp's 16-byte reads cover two
    // whole rows: no bank conflicts).
    uint4 words[C::kTiles][2];
#pragma unroll
    for (int mt = 0; mt < C::kTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        words[mt][h] = *reinterpret_cast<const uint4*>(stage_codes(s) + local_row(mt, h) * 64 + 16 * t);
    const uint32_t x_addr = warp_uniform(static_cast<uint32_t>(__cvta_generic_to_shared(stage_x(s))));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int b = i % 2;
#pragma unroll
      for (int mt = 0; mt < C::kTiles; ++mt) {
        uint32_t d[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t word = i == 0 ? words[mt][h].x : i == 1 ? words[mt][h].y : i == 2 ? words[mt][h].z
                                                                                           : words[mt][h].w;
          dequant::dequant_int4<T>(word, zz[mt][h], ss[mt][h], d[h]);
        }
#pragma unroll
        for (int st = 0; st < 2; ++st) {
          a[b][mt][st][0] = d[0][2 * st];
          a[b][mt][st][1] = d[1][2 * st];
          a[b][mt][st][2] = d[0][2 * st + 1];
          a[b][mt][st][3] = d[1][2 * st + 1];
        }
      }
      wgmma_fence();
#pragma unroll
      for (int st = 0; st < 2; ++st) {
        const int step = 2 * i + st;
        const uint64_t desc = tile_descriptor<true>(x_addr + (step / 4) * C::kXHalfBytes, step % 4, 0);
#pragma unroll
        for (int mt = 0; mt < C::kTiles; ++mt) quant_wgmma<T, kTokens>(acc[mt], a[b][mt][st], desc);
      }
      wgmma_commit();
      wgmma_wait<1>();
      // The previous chunk's mma (at i = 0 the previous stage's last) is done: its registers
      // may be reused from here on, and the previous stage is free.
#pragma unroll
      for (int mt = 0; mt < C::kTiles; ++mt) wgmma_fence_operands(a[1 - b][mt]);
      if (i == 0 && pending >= 0) release(pending);
    }
    pending = s;
    ring_state.advance();
  }
  wgmma_wait<0>();
#pragma unroll
  for (int mt = 0; mt < C::kTiles; ++mt) {
    wgmma_fence_operands(acc[mt]);
    wgmma_fence_operands(a[0][mt]);
    wgmma_fence_operands(a[1][mt]);
  }

  // This piece's sums into the ring (both consumers' mma have read their last stage first):
  // acc[mt][4j + 2h + e] is weight row 16w + g + 8h of tile mt, token 8j + 2t + e.
  named_barrier_sync(3, C::kConsumers * kWarpgroupThreads);
  float* sums = reinterpret_cast<float*>(ring);
#pragma unroll
  for (int mt = 0; mt < C::kTiles; ++mt)
#pragma unroll
    for (int j = 0; j < kTokens / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int token = 8 * j + 2 * t + e;
          if (token < p.m) sums[token * C::kSumsLd + local_row(mt, h)] = acc[mt][4 * j + 2 * h + e];
        }
  cluster_sync();
  // Block r's rows of every token, over the pieces in rank order (gemm_split_reduce_kernel's
  // order), then the bias and the store.
  const int pieces = static_cast<int>(gridDim.x), r = static_cast<int>(blockIdx.x);
  constexpr int kQuads = C::kRows / 4;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(sums));
  gemm_sm90_cluster_reduce_slice<C::kSumsLd, C::kMaxPieces, T, GemmActivation::none>(
      args.out, base, pieces, static_cast<int>(p.m), kQuads * r / pieces, kQuads * (r + 1) / pieces, 0, row0,
      static_cast<int>(threadIdx.x) - kWarpgroupThreads, C::kConsumers * kWarpgroupThreads);
  cluster_sync();
#endif
}

}  // namespace llmk::detail::sm90
