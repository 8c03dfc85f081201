// The Hopper kernel of quantized_gemm for int4 weights at 1-128 tokens (sm_90a): the weight
// as wgmma's register A operand, dequantized from shared memory, x as the shared B operand.
//
// out^T [N, M] = W [N, K] . x^T: a block owns 256 weight rows (two consumer warpgroups of two
// m64 tiles) and all M tokens (kTokens = 64 or 128: the wgmma N), over one piece of K.
//   * Producer (one thread of warpgroup 0): per 128 k (one 512-bit block of codes per row), a
//     stage of the ring holds the x tile [kTokens x 128 k] (two TMA boxes, 128-byte swizzle)
//     and the codes tile [256 rows x 64 bytes] (one box, unswizzled).
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
//   * Per chunk a consumer issues 4 wgmma (2 tiles x 2 steps) on one of two register buffers,
//     then waits for the previous chunk's, so the next dequantization overlaps the mma.
//   * Split-K over gridDim.y pieces; every piece writes its fp32 sums to `partial` ([piece]
//     [token][ld_partial], the layout of gemm_split_reduce_kernel, which adds the pieces in
//     order and applies the bias).
// Roofline (int4 g128): N K / 2 bytes of codes + N K / 64 of scales; x (M K 2 bytes) is read
// once per row block from L2. K4096 N14336: 29.4 MB, 6.9 us at the H200's 4.25 TB/s copy rate;
// the tensor work at M = 128 (15 GFLOP) is ~22 us at a dense 700 TFLOP/s.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/device_types.cuh"
#include "common/sm90/mbarrier.cuh"
#include "common/sm90/tma.cuh"
#include "common/sm90/warpgroup.cuh"
#include "common/sm90/wgmma.cuh"
#include "gemm/quantized.h"
#include "gemm/quantized_dequant.cuh"

namespace llmk::detail::sm90 {

template <int kTokens>
struct QuantSm90Config {
  static constexpr int kRows = 256;     // weight rows per block: 2 consumers x 2 m64 tiles
  static constexpr int kBlockK = 128;   // k per stage: one 512-bit block of int4 codes per row
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = (1 + kConsumers) * kWarpgroupThreads;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static constexpr uint32_t kXHalfBytes = kTokens * 128;  // 64 k of every token
  static constexpr uint32_t kXBytes = 2 * kXHalfBytes;
  static constexpr uint32_t kCodeBytes = kRows * 64;       // 16 words per row
  static constexpr uint32_t kStageBytes = kXBytes + kCodeBytes;
  static constexpr int kStages = 196608 / kStageBytes;      // 4 (128 tokens) or 6 (64)
  static constexpr int kSharedBytes = kStages * kStageBytes + 2 * kStages * 8 + 1024;
  static_assert(kStageBytes % 1024 == 0, "each stage's tiles must stay 1024-byte aligned");
};

struct QuantSm90Args {
  QuantizedParams p;
  float* partial;  // [pieces][m][ld_partial]
  int64_t ld_partial;
  int k_blocks;      // k / 128
  int piece_blocks;  // k blocks per piece (every piece non-empty)
};

// x [m, k] (row stride ldx) -> xp [m, k] (contiguous) in the mma's k order (see above): one
// thread per pair of elements.
template <class T>
__global__ void __launch_bounds__(256) quantized_permute_x_kernel(const T* x, int64_t ldx, T* xp, int64_t m,
                                                                  int64_t k) {
  const int64_t pairs = k / 2;
  for (int64_t item = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; item < m * pairs;
       item += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = item / pairs, kp = (item % pairs) * 2;
    const int within = static_cast<int>(kp % 128), step = within / 16, j = within % 16;
    const int i = step / 2, s = step % 2, hi = j / 8, t = (j % 8) / 2;
    const int64_t src = kp - within + 32 * i + 8 * t + 4 * s + 2 * hi;
    *reinterpret_cast<uint32_t*>(xp + row * k + kp) = *reinterpret_cast<const uint32_t*>(x + row * ldx + src);
  }
}

// wgmma m64 x kTokens x k16 with A from registers, B the K-major x tile.
template <class T, int kTokens>
__device__ __forceinline__ void quant_wgmma(float (&d)[kTokens / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (kTokens == 128) wgmma_m64n128k16_rs<0>(WgmmaTag<T>{}, d, a, desc_b, true);
  else wgmma_m64n64k16_rs<0>(WgmmaTag<T>{}, d, a, desc_b, true);
}

// Grid (row blocks of 256, pieces of K); block kThreads.
template <class T, int kTokens>
__global__ void __launch_bounds__(QuantSm90Config<kTokens>::kThreads, 1)
    quantized_sm90_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_codes,
                          const QuantSm90Args args) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = QuantSm90Config<kTokens>;
  extern __shared__ uint8_t shared_raw[];
  uint8_t* ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(shared_raw) + 1023) & ~uintptr_t{1023});
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + C::kStages * C::kStageBytes);
  uint64_t* empty = full + C::kStages;
  auto stage_x = [&](int s) { return ring + s * C::kStageBytes; };
  auto stage_codes = [&](int s) { return ring + s * C::kStageBytes + C::kXBytes; };

  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], C::kConsumers);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  const QuantizedParams& p = args.p;
  const int64_t row0 = int64_t{blockIdx.x} * C::kRows;
  const int kb_begin = static_cast<int>(blockIdx.y) * args.piece_blocks;
  const int kb_end = kb_begin + args.piece_blocks < args.k_blocks ? kb_begin + args.piece_blocks : args.k_blocks;

  const int wg = warpgroup_index();
  if (wg == 0) {
    warpgroup_release_registers<C::kProducerRegs>();
    if (threadIdx.x == 0) {
      tma_prefetch_map(&map_x);
      tma_prefetch_map(&map_codes);
      RingState<C::kStages> ring_state;
      for (int kb = kb_begin; kb < kb_end; ++kb) {
        const int s = ring_state.stage;
        mbarrier_wait(&empty[s], ring_state.phase ^ 1u);
        mbarrier_arrive_expect_tx(&full[s], C::kStageBytes);
        tma_load_2d(stage_x(s), &map_x, &full[s], 0, kb * C::kBlockK);
        tma_load_2d(stage_x(s) + C::kXHalfBytes, &map_x, &full[s], 0, kb * C::kBlockK + 64);
        tma_load_2d(stage_codes(s), &map_codes, &full[s], static_cast<int32_t>(row0), kb * 16);
        ring_state.advance();
      }
    }
    return;
  }
  warpgroup_claim_registers<C::kConsumerRegs>();
  const int consumer = wg - 1;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = (static_cast<int>(threadIdx.x) / 32) % 4;
  const int g = lane / 4, t = lane % 4;
  const bool leader = threadIdx.x % kWarpgroupThreads == 0;
  const int64_t groups = p.k / p.group_size;
  const T* scales = static_cast<const T*>(p.scales);
  // This lane's weight rows: tile mt, half h (row g or g + 8 of its warp's 16).
  int local_row[2][2];
  int64_t row[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      local_row[mt][h] = consumer * 128 + mt * 64 + 16 * warp + g + 8 * h;
      row[mt][h] = row0 + local_row[mt][h];
    }
  const uint32_t zz_symmetric = dequant::zero_operand<T, 4>(8u);

  constexpr int kAcc = kTokens / 2;
  float acc[2][kAcc];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int e = 0; e < kAcc; ++e) acc[mt][e] = 0.0f;

  // Each row's scale (and zero point) of the group holding k = 128 kb, loaded one stage ahead
  // (a global read: its latency then overlaps the previous stage's work).
  auto load_group = [&](int kb, T (&sv)[2][2], uint32_t (&zv)[2][2]) {
    const int64_t group = int64_t{kb} * C::kBlockK / p.group_size;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool ok = row[mt][h] < p.n && kb < kb_end;
        const int64_t at = row[mt][h] * groups + group;
        sv[mt][h] = ok ? scales[at] : from_float<T>(0.0f);
        zv[mt][h] = p.zeros && ok ? p.zeros[at] : 8u;
      }
  };
  T next_scale[2][2];
  uint32_t next_zero[2][2];
  load_group(kb_begin, next_scale, next_zero);
  RingState<C::kStages> ring_state;
  for (int kb = kb_begin; kb < kb_end; ++kb) {
    uint32_t ss[2][2], zz[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t su = *reinterpret_cast<const unsigned short*>(&next_scale[mt][h]);
        ss[mt][h] = su | (su << 16);
        zz[mt][h] = p.zeros ? dequant::zero_operand<T, 4>(next_zero[mt][h]) : zz_symmetric;
      }
    load_group(kb + 1, next_scale, next_zero);
    const int s = ring_state.stage;
    mbarrier_wait(&full[s], ring_state.phase);
    // The codes tile: 64-byte rows, unswizzled (a quarter warp's 16-byte reads cover two
    // whole rows: no bank conflicts).
    uint4 words[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        words[mt][h] = *reinterpret_cast<const uint4*>(stage_codes(s) + local_row[mt][h] * 64 + 16 * t);
    const uint32_t x_addr = warp_uniform(static_cast<uint32_t>(__cvta_generic_to_shared(stage_x(s))));
    uint32_t a[2][2][2][4];  // [buffer][tile][step][register]
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int b = i % 2;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
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
        for (int mt = 0; mt < 2; ++mt) quant_wgmma<T, kTokens>(acc[mt], a[b][mt][st], desc);
      }
      wgmma_commit();
      wgmma_wait<1>();
      // The previous chunk's mma is done: its registers may be reused from here on.
      if (i > 0) {
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) wgmma_fence_operands(a[1 - b][mt]);
      }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      wgmma_fence_operands(acc[mt]);
      wgmma_fence_operands(a[1][mt]);
    }
    // Every warp has read its codes (the wgmma above synchronized the warpgroup) and the
    // mma has read x: the stage goes back to the producer.
    named_barrier_sync(1 + consumer, kWarpgroupThreads);
    if (leader) mbarrier_arrive(&empty[s]);
    ring_state.advance();
  }

  // This piece's sums: acc[mt][4j + 2h + e] is weight row 16w + g + 8h of tile mt, token
  // 8j + 2t + e.
  float* out = args.partial + int64_t{blockIdx.y} * p.m * args.ld_partial;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < kTokens / 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t token = 8 * j + 2 * t + e, r = row[mt][h];
          if (token < p.m && r < p.n) out[token * args.ld_partial + r] = acc[mt][4 * j + 2 * h + e];
        }
#endif
}

}  // namespace llmk::detail::sm90
