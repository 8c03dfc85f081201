// The mma.sync GEMM: out = act(a · bᵀ + bias) + residual for every shape, layout and
// alignment, on every GPU from Ampere on (sm_80 instructions only). It is the fallback:
// Hopper runs its large problems on the TMA + wgmma kernel (gemm_sm90.cu) and decode-sized
// ones on the split-K kernel (gemm_small_m.cu); this kernel takes what those two do not
// (other dtype pairs, layouts, alignments, K == 0) and everything on Ampere/Ada.
//
// Algorithm. One CTA of 256 threads (8 warps, 2 along M x 4 along N) computes a 128 x 128
// tile of a·bᵀ with fp32 accumulators, K in steps of 32:
//   - global -> shared through a 3-stage cp.async pipeline (16-byte copies; chunks wholly
//     past the edge of the matrix zero-filled by cp.async's src-size 0, the partial chunk
//     at the end of a row loaded element-wise). Operands that break the 16-byte rule go
//     through a template twin whose loads are all element-wise and synchronous (correct,
//     not fast).
//   - K-major tiles are stored [rows][32 k] (64-byte rows, 16-byte chunks XOR-swizzled by
//     (row / 2) % 4), MN-major tiles [32 k][128 rows] (256-byte k-rows, chunks swizzled by
//     k % 8): ldmatrix (K-major) and ldmatrix.trans (MN-major) read both conflict-free and
//     produce the same mma fragments, so the inner loop is layout-blind.
//   - each warp owns 64 rows x 32 columns: 4 m16 tiles x 4 n8 tiles, 16 mma.m16n8k16 per
//     k16 step. Its columns are two 16-wide strips, one in each half of the CTA tile
//     (tile columns 16w..16w+15 and 64+16w..64+16w+15), so that for silu_mul, where the
//     CTA's B columns are 64 gate columns followed by the 64 matching up columns, every
//     gate value and its up value meet in the same CTA (output tile 128 x 64).
//   - epilogue: the accumulators go through shared memory (64 rows at a time, fp32) and
//     come out row by row, so that bias, activation (gemm_epilogue.cuh, run-time branches)
//     and residual are applied with coalesced loads and stores in any out dtype and stride.
// Indices that can pass 2^31 (row * ld) are int64.
//
// Roofline. FLOPs 2 M N K. Each CTA reads (128 + 128) x 32 elements per 2 x 128 x 128 x 32
// FLOPs: 64 FLOP per byte from L2, so large problems are tensor-bound. mma.sync peaks at
// ~312 TFLOP/s dense bf16 on A100; on H100 it can issue at most ~2/3 of the wgmma rate
// (989 TFLOP/s), and this kernel (no fragment double buffering, no warp specialization)
// measured 245-270 TFLOP/s at 4096^3 and 8192^3 bf16 on an H100 (cuBLAS: 860-900): it is
// clearly the slow path there, the reason the Hopper kernel exists. Small M is bound by
// reading b (2 N K bytes) and wastes most of each 128-row tile: the small-M kernel's job.
// Registers: 119-128 per thread, no spills (2 CTAs of 256 threads per SM), 48 KB static
// shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/device_types.cuh"
#include "common/ptx.cuh"
#include "gemm/gemm.h"
#include "gemm/gemm_epilogue.cuh"

namespace llmk::detail::sm80 {

struct Config {
  static constexpr int kThreads = 256;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 128;  // B columns per CTA (64 gate + 64 up for silu_mul)
  static constexpr int kBlockK = 32;
  static constexpr int kStages = 3;
  static constexpr int kTileBytes = kBlockM * kBlockK * 2;       // one operand tile, 8 KB
  static constexpr int kStageBytes = 2 * kTileBytes;             // A + B
  static constexpr int kPipeBytes = kStages * kStageBytes;       // 48 KB
  static constexpr int kEpiLd = kBlockN + 8;                      // fp32 staging row (floats)
  static constexpr int kEpiBytes = 64 * kEpiLd * 4;               // 64 rows: 34 KB
  static constexpr int kSharedBytes = kPipeBytes > kEpiBytes ? kPipeBytes : kEpiBytes;
  static constexpr int kRasterGroup = 8;  // CTAs walk 8 M tiles per N tile (L2 reuse of b)
};

// Byte offset of 16-byte chunk `c` (0..3) of row `r` in a K-major tile [128][32].
__device__ __forceinline__ uint32_t kmajor_offset(int r, int c) {
  return static_cast<uint32_t>(r * 64 + ((c ^ ((r >> 1) & 3)) << 4));
}
// Byte offset of 16-byte chunk `c` (0..15) of k-row `k` in an MN-major tile [32][128].
__device__ __forceinline__ uint32_t mnmajor_offset(int k, int c) {
  return static_cast<uint32_t>(k * 256 + ((c ^ (k & 7)) << 4));
}

// 16 bytes global -> shared, only the first `src_bytes` (0..16) read, the rest zeros.
__device__ __forceinline__ void cp_async_zfill(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// One 16-byte chunk of 8 elements: `count` (0..8) consecutive elements from src, zeros
// after them. Aligned (src 16-byte aligned when count > 0): cp.async for whole chunks and
// empty ones. Partial chunks (the last one of a row that ends inside a 16-byte vector) and
// every chunk of unaligned operands go element by element, synchronously: a partial
// cp.async (src-size < 16) would be exact on the hardware, but compute-sanitizer counts it
// as a 16-byte read past the end of the allocation.
template <bool kAligned>
__device__ __forceinline__ void load_chunk(uint32_t dst, const void* src, int count) {
  if (kAligned && (count == 8 || count == 0)) {
    cp_async_zfill(dst, src, count * 2);
  } else {
    const unsigned short* s = static_cast<const unsigned short*>(src);
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = 2 * i < count ? s[2 * i] : 0u;
      const uint32_t hi = 2 * i + 1 < count ? s[2 * i + 1] : 0u;
      w[i] = lo | (hi << 16);
    }
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]),
                 "r"(w[3]));
  }
}

__device__ __forceinline__ int clamp_count(int64_t remaining) {
  return remaining <= 0 ? 0 : remaining >= 8 ? 8 : static_cast<int>(remaining);
}

// Tile column `col` of the B tile (0..127) -> its global column and the end of the range
// it lies in: plain: n0 + col < n; silu_mul: gate j0 + col < n/2, up n/2 + j0 + col - 64 < n.
struct BColumns {
  int64_t n0;    // plain: first column of the tile; silu_mul: first output column j0
  int64_t half;  // n / 2 (silu_mul), 0 otherwise
  int64_t n;
  bool silu;
  __device__ __forceinline__ void at(int col, int64_t& g, int64_t& limit) const {
    if (!silu) {
      g = n0 + col;
      limit = n;
    } else if (col < 64) {
      g = n0 + col;
      limit = half;
    } else {
      g = half + n0 + (col - 64);
      limit = n;
    }
  }
};

// Issues the copies of k-tile `kt` into the stage at shared address `stage` (A tile, then
// B tile): 512 16-byte chunks per operand, 2 per thread.
template <class T, bool kAK, bool kBK, bool kAligned>
__device__ __forceinline__ void load_stage(const GemmParams& p, uint32_t stage, int64_t kt, int64_t m0,
                                           const BColumns& bc, int tid) {
  const int64_t k0 = kt * Config::kBlockK;
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int q = tid + i * Config::kThreads;
    if constexpr (kAK) {
      const int r = q >> 2, c = q & 3;
      const int64_t row = m0 + r, k = k0 + c * 8;
      const int count = row < p.m ? clamp_count(p.k - k) : 0;
      load_chunk<kAligned>(stage + kmajor_offset(r, c), count > 0 ? a + row * p.lda + k : a, count);
    } else {
      const int kr = q >> 4, c = q & 15;
      const int64_t k = k0 + kr, row = m0 + c * 8;
      const int count = k < p.k ? clamp_count(p.m - row) : 0;
      load_chunk<kAligned>(stage + mnmajor_offset(kr, c), count > 0 ? a + k * p.lda + row : a, count);
    }
  }
  const uint32_t bstage = stage + Config::kTileBytes;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int q = tid + i * Config::kThreads;
    int64_t g, limit;
    if constexpr (kBK) {
      const int r = q >> 2, c = q & 3;
      bc.at(r, g, limit);
      const int64_t k = k0 + c * 8;
      const int count = g < limit ? clamp_count(p.k - k) : 0;
      load_chunk<kAligned>(bstage + kmajor_offset(r, c), count > 0 ? b + g * p.ldb + k : b, count);
    } else {
      const int kr = q >> 4, c = q & 15;
      bc.at(c * 8, g, limit);  // 8 tile columns never straddle the gate/up boundary (64)
      const int64_t k = k0 + kr;
      const int count = k < p.k ? clamp_count(limit - g) : 0;
      load_chunk<kAligned>(bstage + mnmajor_offset(kr, c), count > 0 ? b + k * p.ldb + g : b, count);
    }
  }
}

// Tile column of the first of the 8 columns of a warp's n8 tile nt (0..3): two 16-wide
// strips, one in each half of the tile.
__device__ __forceinline__ int warp_col8(int warp_n, int nt) {
  return (nt >> 1) * 64 + warp_n * 16 + (nt & 1) * 8;
}

// act(z + bias) + residual of output element (row, col), staged at s[r][c] (silu_mul: the
// gate at s[r][c], its up value at s[r][c + 64]).
template <class TOut>
__device__ __forceinline__ float epilogue_value(const GemmParams& p, const float* s, int r, int c, int64_t row,
                                                int64_t col, int64_t half) {
  float v;
  if (p.activation == GemmActivation::silu_mul) {
    const float gate = s[r * Config::kEpiLd + c] + gemm_bias_at<TOut>(p, col);
    const float up = s[r * Config::kEpiLd + c + 64] + gemm_bias_at<TOut>(p, col + half);
    v = gemm_silu_mul(gate, up);
  } else {
    v = s[r * Config::kEpiLd + c] + gemm_bias_at<TOut>(p, col);
    if (p.activation == GemmActivation::gelu) v = gemm_activate<GemmActivation::gelu>(v);
    else if (p.activation == GemmActivation::gelu_tanh) v = gemm_activate<GemmActivation::gelu_tanh>(v);
  }
  return v + gemm_residual_at<TOut>(p, row, col);
}

// Stages the accumulators through shared memory, 64 rows (one warp row) at a time, and
// writes out[m0 .., col0 ..] with one thread per consecutive column.
template <class TOut>
__device__ __forceinline__ void epilogue(const GemmParams& p, float (&acc)[4][4][4], float* s, int64_t m0,
                                         int64_t col0, int warp_m, int warp_n, int lane, int tid) {
  const bool silu = p.activation == GemmActivation::silu_mul;
  const int64_t half = silu ? p.n / 2 : 0;
  const int64_t n_out = p.n_out();
  const int cols_log2 = silu ? 6 : 7;  // 64 or 128 output columns
  const int group = lane >> 2, t = lane & 3;
  TOut* out = static_cast<TOut*>(p.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (warp_m == h) {
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int r = mt * 16 + group, c = warp_col8(warp_n, nt) + 2 * t;
          *reinterpret_cast<float2*>(&s[r * Config::kEpiLd + c]) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
          *reinterpret_cast<float2*>(&s[(r + 8) * Config::kEpiLd + c]) =
              make_float2(acc[mt][nt][2], acc[mt][nt][3]);
        }
    }
    __syncthreads();
    const int64_t row0 = m0 + h * 64;
    const int total = 64 << cols_log2;
    for (int idx = tid; idx < total; idx += Config::kThreads) {
      const int r = idx >> cols_log2, c = idx & ((1 << cols_log2) - 1);
      const int64_t row = row0 + r, col = col0 + c;
      if (row < p.m && col < n_out)
        out[row * p.ld_out + col] = from_float<TOut>(epilogue_value<TOut>(p, s, r, c, row, col, half));
    }
    __syncthreads();
  }
}

template <class T, bool kAK, bool kBK, bool kAligned>
__global__ void __launch_bounds__(Config::kThreads, 2) gemm_sm80_kernel(const GemmParams p) {
  __shared__ __align__(128) unsigned char smem[Config::kSharedBytes];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp >> 2, warp_n = warp & 3;
  const bool silu = p.activation == GemmActivation::silu_mul;

  // Grouped raster: consecutive CTAs take kRasterGroup M tiles of one N tile.
  const int64_t out_cols = silu ? Config::kBlockN / 2 : Config::kBlockN;
  const int64_t tiles_m = (p.m + Config::kBlockM - 1) / Config::kBlockM;
  const int64_t tiles_n = (p.n_out() + out_cols - 1) / out_cols;
  const int64_t bid = blockIdx.x;
  const int64_t per_group = Config::kRasterGroup * tiles_n;
  const int64_t first_m = bid / per_group * Config::kRasterGroup;
  const int64_t group_m = tiles_m - first_m < Config::kRasterGroup ? tiles_m - first_m : Config::kRasterGroup;
  const int64_t tile_m = first_m + (bid % per_group) % group_m;
  const int64_t tile_n = (bid % per_group) / group_m;
  const int64_t m0 = tile_m * Config::kBlockM;
  const int64_t col0 = tile_n * out_cols;  // first output column
  const BColumns bc{col0, silu ? p.n / 2 : 0, p.n, silu};

  float acc[4][4][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

  const uint32_t smem_base = ptx::smem_address(smem);
  const int64_t k_tiles = (p.k + Config::kBlockK - 1) / Config::kBlockK;
#pragma unroll
  for (int s = 0; s < Config::kStages - 1; ++s) {
    if (s < k_tiles) load_stage<T, kAK, kBK, kAligned>(p, smem_base + s * Config::kStageBytes, s, m0, bc, tid);
    ptx::cp_async_commit();
  }

  // Per-lane parts of the ldmatrix addresses (see ptx.cuh for the fragment layouts).
  const int l8 = lane & 7, l_hi = (lane >> 3) & 1, l_q = lane >> 4;

  int stage = 0;
  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    ptx::cp_async_wait<Config::kStages - 2>();
    __syncthreads();  // tile kt visible to all; everyone is done with the stage refilled next
    {
      const int64_t next = kt + Config::kStages - 1;
      int next_stage = stage + Config::kStages - 1;
      if (next_stage >= Config::kStages) next_stage -= Config::kStages;
      if (next < k_tiles)
        load_stage<T, kAK, kBK, kAligned>(p, smem_base + next_stage * Config::kStageBytes, next, m0, bc, tid);
      ptx::cp_async_commit();
    }
    const uint32_t as = smem_base + stage * Config::kStageBytes;
    const uint32_t bs = as + Config::kTileBytes;
#pragma unroll
    for (int ks = 0; ks < Config::kBlockK / 16; ++ks) {
      uint32_t af[4][4], bf[4][2];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        const int mbase = warp_m * 64 + mt * 16;
        if constexpr (kAK) {
          ptx::ldmatrix_x4(af[mt], as + kmajor_offset(mbase + l8 + l_hi * 8, ks * 2 + l_q));
        } else {
          ptx::ldmatrix_x4_trans(af[mt], as + mnmajor_offset(ks * 16 + l8 + l_q * 8, (mbase >> 3) + l_hi));
        }
      }
#pragma unroll
      for (int pr = 0; pr < 2; ++pr) {
        const int nbase = warp_col8(warp_n, 2 * pr);
        uint32_t r[4];
        if constexpr (kBK) {
          ptx::ldmatrix_x4(r, bs + kmajor_offset(nbase + l8 + l_q * 8, ks * 2 + l_hi));
        } else {
          ptx::ldmatrix_x4_trans(r, bs + mnmajor_offset(ks * 16 + l8 + l_hi * 8, (nbase >> 3) + l_q));
        }
        bf[2 * pr][0] = r[0];
        bf[2 * pr][1] = r[1];
        bf[2 * pr + 1][0] = r[2];
        bf[2 * pr + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) ptx::mma_16x8x16<T>(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
    }
    if (++stage == Config::kStages) stage = 0;
  }
  ptx::cp_async_wait<0>();
  __syncthreads();  // the pipeline buffers become the epilogue's staging area

  float* s = reinterpret_cast<float*>(smem);
  switch (p.out_dtype) {
    case DType::f32: epilogue<float>(p, acc, s, m0, col0, warp_m, warp_n, lane, tid); break;
    case DType::f16: epilogue<__half>(p, acc, s, m0, col0, warp_m, warp_n, lane, tid); break;
    default: epilogue<__nv_bfloat16>(p, acc, s, m0, col0, warp_m, warp_n, lane, tid); break;
  }
}

}  // namespace llmk::detail::sm80
