// The small-M (decode) GEMM: out[M, N_out] = epilogue(x[M, K] · W[N, K]ᵀ) for M <= 64
// tokens, streaming the weight once at the HBM bandwidth limit; and rmsnorm_linear, the
// same kernel with an RMSNorm prologue on x.
//
// Roofline (H100 SXM, 132 SMs, ~3.0 TB/s measured copy rate, bf16):
//   bytes = N*K*2 (weight) + M*K*2 (x) + M*N_out*sizeof(out), FLOPs = 2*M*N*K.
//   At M = 64 that is 64 FLOP per weight element (32 FLOP/byte): 96 TFLOP/s at 3 TB/s,
//   above the fp32 FFMA rate (~60 TFLOP/s) but ~15% of the mma.sync tensor rate, so the
//   multiply runs on tensor cores and the kernel stays bound by the weight stream
//   (x is read from L2: M*K*2 per CTA, M/R of the weight bytes for R rows per CTA):
//   (4096, 4096) 33.5 MB -> 11.2 us at 3.0 TB/s; (28672, 4096) 235 MB -> 78 us;
//   (37888, 3584) 272 MB -> 91 us (the x and out bytes are < 2% at M = 64).
//
// Algorithm. mma.sync m16n8k16 with the WEIGHT as the A operand (16 weight rows = the mma
// M dim) and the tokens as the B operand (8 tokens per n8 tile, NT = 1, 2, 4, 8 tiles for
// M <= 8, 16, 32, 64). A k-reduction is invariant under a permutation of k applied to both
// operands, so a thread (group g = lane / 4, t = lane % 4) loads 16 contiguous bytes
// (k = 32c + 8t .. 8t + 7) of weight rows g and g + 8 straight from global memory into
// registers and uses them as its A fragments of two k16 steps: step s takes the elements
// 4s .. 4s + 3 (a0/a2 = row g pairs, a1/a3 = row g + 8 pairs); the x fragment of token g is
// then the same 16 bytes of x's row (b0, b1 = its pairs 2s, 2s + 1). No shared memory or
// ldmatrix for the weight; every weight byte is loaded once with ld.global.nc
// .L1::no_allocate (streamed past L1) in coalesced 64-byte row segments.
//   * A warp owns 32 weight rows (two m16 tiles, so each x fragment read from shared memory
//     feeds 2 mma) and keeps U chunks of 32 k in flight in a register ring (U = 4, 8 KB per
//     warp, for NT <= 4; U = 2, 4 KB, for NT = 8, whose 64 accumulators leave no room):
//     the loads of the next U chunks are issued as soon as the current ones are consumed.
//     Little's law: ~3 TB/s x ~1-1.3 us loaded latency = 3-4 MB in flight over the GPU, which
//     the launcher's grid provides (>= 4 MB where it can: e.g. 120 CTAs x 9 warps x 4 KB).
//   * x is small and re-read by every CTA, so each CTA stages x[M, k-tile] in shared memory
//     (cp.async, kSmallMStages-deep ring, one barrier per k tile), chunk-major ([chunk]
//     [token][32 k]): a lane's fragment is at a compile-time offset and a quarter warp's
//     LDS.128 covers 128 contiguous bytes (no bank conflicts). x's L2 traffic is M/R of the
//     weight bytes for R weight rows per CTA: the launcher keeps R >= 192 at M > 16 and
//     splits K instead of N when N is small.
//   * Split-K, deterministic and without workspace: (a) within the CTA, wk groups of warps
//     take different k ranges of each tile; (b) on sm_90, across the CTAs of a thread-block
//     cluster (up to 8 along K, gridDim.x): each CTA writes its fp32 partial tile to its
//     shared memory, the cluster barrier publishes it, and each CTA reduces a 1/C slice of
//     the rows over all partials (distributed shared memory, fixed order) and runs the
//     epilogue. sm_80 code has no cluster path; the launcher then uses C = 1.
//   * Launch shape (gemm_small_m.cu, pick_small_m_config): the smallest C, then the largest
//     R, giving one wave that covers >= 85% of the SMs with >= 4 MB in flight.
//   * Measured on the H100 (bf16, back-to-back launches, rotated weights; see the report of
//     this kernel's first version): M = 1 and 16 reach 2.7-2.87 TB/s on the large shapes
//     ((28672, 4096), (37888, 3584)), 2.4-2.6 TB/s at K >= 14336, ~1.8-2.2 TB/s on the 33-50 MB
//     shapes, where ~6 us of launch, ramp and reduction are a third of the time; M = 64 is
//     at 1.3-2.1 TB/s (4 KB in flight per warp and the mma/LDS work per byte).
//   * Epilogue (gemm_epilogue.cuh): bias, activation (silu_mul pairs gate row j with up row
//     j + n/2: a CTA's rows are R/2 gate rows and the R/2 matching up rows, so both sums meet
//     in its reduction buffer), residual (may alias out: each element is read and written by
//     one thread), out f32/f16/bf16; run-time branches outside the k loop.
//   * rmsnorm_linear (a.g != nullptr): each CTA first computes the sum of squares of its k
//     range of every x row (fp32, from L2), the cluster exchanges the partial sums, and rstd
//     = rsqrt(sum / K + eps) as rmsnorm's kernel computes it. Each staged x tile is then
//     rewritten in place as round_T(x * rstd * g) (fp32 math, rounded to x's dtype once,
//     which mirrors rmsnorm (whose output is rounded to the dtype) followed by a linear).
//     Rows beyond 64 run as further 64-token chunks along gridDim.z: correct for any M,
//     built for M <= 64 (the weight is re-read per chunk).
//   * Quantized weights (kBits = 4 or 8, quantized_gemm.cu): the weight is int4 / int8 codes in
//     the layout of include/llmk/quantized_gemm.h, whose k order is this kernel's permutation:
//     a lane's 16-byte load holds 32 (int4) or 16 (int8) codes of one row, i.e. 4 or 2 of the
//     chunks above, dequantized in registers into the same A fragments ((magic + q) by one LOP3
//     or PRMT, minus (magic + z) exactly, times the group's scale: one rounding, the weight
//     dequantize_weight writes). Each load's scale (and zero point) is read with it; a load
//     never spans two groups (G is a multiple of its k span).
//     int4 at M <= 16 (kFold) moves the scale and the zero point out of the fragments: each
//     load's 128 k accumulate unscaled into a second accumulator set, and when the load is
//     consumed acc += s * that sum, one FFMA per accumulator instead of an HMUL2 per weight
//     pair. bf16 multiplies (magic + q) = 128 + q as it comes from the LOP3 and subtracts
//     (128 + z) * sum(x over the load's k) afterwards (the sum by an mma with a ones fragment,
//     once per chunk for all of the warp's rows): 7 integer ops per 8 codes instead of 15. f16
//     keeps the exact HSUB2 of (1024 + z) (its magic/ulp ratio of 1024 would cost the fp32
//     sums 10 bits). The product is then s * sum (q - z) x, the unrounded weight's.
#pragma once

#include <cuda/ptx>

#include <cstdint>
#include <type_traits>

#include "common/device_types.cuh"
#include "common/ptx.cuh"
#include "common/reduce.cuh"
#include "gemm/gemm.h"
#include "gemm/gemm_epilogue.cuh"
#include "gemm/quantized_dequant.cuh"

namespace llmk::detail {

inline constexpr int kSmallMWarpRows = 32;       // weight rows per warp (two m16 tiles)
inline constexpr int kSmallMChunk = 32;          // k per chunk (16 bytes per lane and row)
inline constexpr int kSmallMStages = 3;          // x tiles in the shared ring
inline constexpr int kSmallMRedPad = 4;          // floats of padding per partial row
inline constexpr int kSmallMMaxClusterSize = 8;  // portable cluster size

// Chunks of 32 k in flight per warp (the weight ring: 16 registers per chunk) and the most
// threads per CTA, so that the register cap (ptxas: 64K / threads rounded up to 128) holds
// the accumulators (8 NT), the ring and the x fragments (4 NT) without spilling (ptxas -v,
// sm_90a and sm_80): NT = 8 keeps 2 chunks (4 KB per warp in flight) at 168 registers,
// 12 warps per SM; NT = 4 4 chunks (8 KB) at 168; NT <= 2 4 chunks at 128, 16 warps per
// SM. rmsnorm_linear's per-tile normalization needs more at NT >= 4, and so does the
// sm_80 code: 256 threads there. (The launcher reads the bound of the loaded machine code
// from cudaFuncGetAttributes, so it may differ between architectures.)
template <int NT>
inline constexpr int kSmallMUnroll = NT >= 8 ? 2 : 4;
// Quantized weights (kBits 4 or 8; 16 = the dense T weight): one 16-byte load per lane and
// row holds 16 / kBits chunks of 32 k (4 for int4, 2 for int8); a body keeps two loads per
// row in flight (4 KB per warp, 32 ring registers): measured on the H200, four (8 KB per
// warp, at 256 threads per CTA for the registers) ran M = 1 slower (24.7 against 20.5 us
// at 14336 x 4096, 34.8 against 24.0 at 4096 x 14336): the dequantization is issue-bound
// and wants the warps more than the bytes.
template <int kBits>
inline constexpr int kSmallMChunksPerLoad = 16 / kBits;
template <int NT, int kBits>
inline constexpr int kSmallMBodyChunks = kBits == 16 ? kSmallMUnroll<NT> : 2 * kSmallMChunksPerLoad<kBits>;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
inline constexpr int kSmallMWideThreads = 256;
#else
inline constexpr int kSmallMWideThreads = 384;
#endif
template <int NT, bool kNorm>
inline constexpr int kSmallMMaxThreads = NT >= 4 ? (kNorm ? 256 : kSmallMWideThreads) : 512;
// Quantized weights also hold each load's scales and zero operands and dequantize into
// fragments: without spills, 384 threads (168 registers) at NT <= 2 (512 spills at NT = 1),
// 256 (255) above.
template <int NT>
inline constexpr int kSmallMQuantMaxThreads = NT <= 2 ? 384 : 256;

struct SmallMArgs {
  GemmParams p;         // a = x [m, k], b = weight [n, k], out [m, n_out]; epilogue fields
  const void* g;        // rmsnorm_linear: the norm weight [k]; nullptr for a plain gemm
  bool g_f32;           // g is float32 (else x's dtype)
  bool g_aligned;       // g is 16-byte aligned (vector loads)
  float eps;
  // quantized_gemm (p.b = the packed codes, ldb in int32 words): the scales [n, groups] of
  // x's dtype, the zero points (uint8 [n, groups]; nullptr: 2^(bits-1)), the group size.
  const void* scales;
  const uint8_t* zeros;
  int64_t groups;
  int group_size;
  int group_shift;  // log2(group_size) when a power of two, 31 with one group per row, else -1
  int wr, wk;           // warps along rows and along k; blockDim.x = 32 * wr * wk
  int bodies_per_tile;  // a warp's k per tile: kt_w = 32 * kSmallMUnroll * bodies_per_tile
  int tiles;            // k tiles of kt_cta = wk * kt_w
  // Derived on the host (kernel parameters cost no registers): kt_w, kt_cta, and the
  // elements of one x stage (kt_cta * 8 * NT).
  int kt_w, kt_cta, stage_elems;
};

// k of one loop body of a warp (kSmallMBodyChunks chunks) for `nt` token tiles and weights
// of `bits` (16: dense).
inline constexpr int small_m_body_k(int nt, int bits = 16) {
  return kSmallMChunk * (bits == 4   ? kSmallMBodyChunks<1, 4>
                         : bits == 8 ? kSmallMBodyChunks<1, 8>
                                     : (nt >= 8 ? kSmallMUnroll<8> : kSmallMUnroll<1>));
}

// Dynamic shared memory of a launch: the x ring, and after the k loop the partial tiles
// ([wk][tokens][rows + pad] fp32) in the same bytes.
inline int64_t small_m_ring_bytes(int nt, int wk, int bodies_per_tile, int elem_bytes, int bits = 16) {
  const int64_t kt_cta = int64_t{wk} * small_m_body_k(nt, bits) * bodies_per_tile;
  return int64_t{kSmallMStages} * 8 * nt * kt_cta * elem_bytes;
}
inline int64_t small_m_reduce_bytes(int nt, int wr, int wk) {
  return int64_t{wk} * 8 * nt * (kSmallMWarpRows * wr + kSmallMRedPad) * 4;
}
inline int64_t small_m_smem_bytes(int nt, int wr, int wk, int bodies_per_tile, int elem_bytes, int bits = 16) {
  const int64_t ring = small_m_ring_bytes(nt, wk, bodies_per_tile, elem_bytes, bits);
  const int64_t red = small_m_reduce_bytes(nt, wr, wk);
  return ring > red ? ring : red;
}

// gemm_small_m.cu: the 8-token tiles for m rows (1, 2, 4 or 8), and the launch of one
// instantiation (`bits` its kBits) over `chunks` 64-token chunks with the launch shape picked
// for the problem.
int small_m_token_tiles(int64_t m);
void launch_small_m_kernel(const char* op, const void* kernel, SmallMArgs& args, int nt, int64_t chunks, int bits,
                           cudaStream_t stream);

namespace small_m {

// 16 bytes of the weight, streamed: not kept in L1 (read once), the L2 asked to fetch the
// surrounding 256 bytes (the next chunks of the same row). `pred` false gives zeros and
// reads nothing.
__device__ __forceinline__ uint4 load_weight(const void* ptr, bool pred) {
  uint4 v;
  asm("{\n"
      "  .reg .pred p;\n"
      "  setp.ne.b32 p, %5, 0;\n"
      "  mov.b32 %0, 0;\n"
      "  mov.b32 %1, 0;\n"
      "  mov.b32 %2, 0;\n"
      "  mov.b32 %3, 0;\n"
      "  @p ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      "}\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(ptr), "r"(static_cast<int>(pred)));
  return v;
}

// 16 bytes of a staged x tile. volatile keeps it in program order with the (volatile) mma
// of ptx.cuh: the compiler may not hoist the next chunk's fragments above this chunk's mma,
// which bounds the live fragment registers to one chunk's.
__device__ __forceinline__ uint4 load_x(const void* smem_ptr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(ptx::smem_address(smem_ptr)));
  return v;
}

// Cluster-wide barrier (all threads of all CTAs of the cluster) with release/acquire
// semantics for shared memory; a CTA barrier when the launch has no cluster.
__device__ __forceinline__ void cluster_or_block_sync(int cluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cluster > 1) {
    cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
    cuda::ptx::barrier_cluster_wait();
    return;
  }
#endif
  (void)cluster;
  __syncthreads();
}

// `p` (this CTA's shared memory) in the shared memory of cluster CTA `rank` (generic
// address); `p` itself without a cluster.
template <class T>
__device__ __forceinline__ const T* cluster_peer(const T* p, int rank, int cluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cluster > 1) return static_cast<const T*>(__cluster_map_shared_rank(const_cast<T*>(p), rank));
#endif
  (void)rank;
  (void)cluster;
  return p;
}

// g[k .. k + 8) of rmsnorm_linear's norm weight (f32 or T) in fp32 (k a multiple of 8).
template <class T, class Args>
__device__ __forceinline__ void load_norm_weight(const Args& a, int k, float (&gv)[8]) {
  if (a.g_aligned) {
    if (a.g_f32) {
      const float4 lo = *reinterpret_cast<const float4*>(static_cast<const float*>(a.g) + k);
      const float4 hi = *reinterpret_cast<const float4*>(static_cast<const float*>(a.g) + k + 4);
      gv[0] = lo.x; gv[1] = lo.y; gv[2] = lo.z; gv[3] = lo.w;
      gv[4] = hi.x; gv[5] = hi.y; gv[6] = hi.z; gv[7] = hi.w;
    } else {
      const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const T*>(a.g) + k);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int j = 0; j < 8; ++j) gv[j] = to_float(e[j]);
    }
    return;
  }
  if (a.g_f32) {
    const float* gf = static_cast<const float*>(a.g) + k;
#pragma unroll
    for (int j = 0; j < 8; ++j) gv[j] = gf[j];
  } else {
    const T* gt = static_cast<const T*>(a.g) + k;
#pragma unroll
    for (int j = 0; j < 8; ++j) gv[j] = to_float(gt[j]);
  }
}

// The epilogue of one output element, in out's type.
template <class TOut>
__device__ __forceinline__ void store_out(const GemmParams& p, int64_t row, int64_t col, float acc, float up) {
  float v = acc + gemm_bias_at<TOut>(p, col);
  switch (p.activation) {
    case GemmActivation::none: break;
    case GemmActivation::silu_mul: v = gemm_silu_mul(v, up + gemm_bias_at<TOut>(p, col + p.n / 2)); break;
    case GemmActivation::gelu: v = gemm_activate<GemmActivation::gelu>(v); break;
    case GemmActivation::gelu_tanh: v = gemm_activate<GemmActivation::gelu_tanh>(v); break;
  }
  v += gemm_residual_at<TOut>(p, row, col);
  static_cast<TOut*>(p.out)[row * p.ld_out + col] = from_float<TOut>(v);
}

}  // namespace small_m

// Grid: (cluster size C along K, row blocks, 64-token chunks of x); block: 32 * wr * wk.
// T: the input dtype (__half or __nv_bfloat16); NT: 8-token tiles; kNorm: rmsnorm_linear
// (a separate instantiation: its per-tile pass would cost the plain GEMM registers); kBits:
// 16 for a dense T weight, 4 or 8 for quantized_gemm's packed codes (p.b, ldb in words).
template <class T, int NT, bool kNorm, int kBits = 16>
__global__ void __launch_bounds__(kBits == 16 ? kSmallMMaxThreads<NT, kNorm> : kSmallMQuantMaxThreads<NT>)
    gemm_small_m_kernel(const __grid_constant__ SmallMArgs a) {
  constexpr int kTokens = 8 * NT;
  constexpr bool kQuant = kBits != 16;
  constexpr int U = kSmallMBodyChunks<NT, kBits>;
  constexpr int CPL = kSmallMChunksPerLoad<kBits>;  // chunks of 32 k per 16-byte load
  constexpr int L = U / CPL;                         // loads per row in a body
  static_assert(!(kQuant && kNorm), "rmsnorm_linear has no quantized weights");
  // int4 at M <= 16: the scale is applied to each load's fp32 partial sums (one FFMA per
  // accumulator) instead of to every weight pair (HMUL2), and for bf16 the zero point
  // through the sum of x over the load's k span (an mma by a ones fragment shared by the
  // warp's rows): 7 integer ops per 8 codes instead of 15 (above 16 rows the second
  // accumulator set would not fit the registers).
  constexpr bool kFold = kBits == 4 && NT <= 2;
  constexpr bool kFoldZero = kFold && std::is_same_v<T, __nv_bfloat16>;
  using W = std::conditional_t<kQuant, uint32_t, T>;  // the weight pointer's element
  // k -> W elements: k * kBits / (8 sizeof(W)); a lane's 16 bytes at 16 t bytes of a chunk.
  constexpr int kKPerW = 8 * static_cast<int>(sizeof(W)) / kBits;
  constexpr int kLaneW = 16 / static_cast<int>(sizeof(W));
  constexpr int kBodyK = kSmallMChunk * U;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float norm_partial[kTokens];  // rmsnorm_linear: this CTA's sums of squares
  __shared__ float norm_rstd[kTokens];

  const GemmParams& p = a.p;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int g = lane / 4, t = lane % 4;
  const int nthreads = static_cast<int>(blockDim.x), nwarps = nthreads / 32;
  const int wr = warp % a.wr, wk = warp / a.wr;
  const int cluster = static_cast<int>(gridDim.x);
  const int rank = static_cast<int>(blockIdx.x);  // the cluster spans gridDim.x
  const int rows_cta = kSmallMWarpRows * a.wr;
  const int kt_w = a.kt_w;
  const int kt_cta = a.kt_cta;
  const int k = static_cast<int>(p.k);
  const int64_t m0 = int64_t{blockIdx.z} * kTokens;
  const int m_chunk = static_cast<int>(p.m - m0 < kTokens ? p.m - m0 : kTokens);
  const bool silu = p.activation == GemmActivation::silu_mul;
  const int64_t half = p.n / 2;

  // This CTA's k tiles [t_lo, t_hi) (balanced over the cluster) and the end of its k range.
  const int t_lo = rank * a.tiles / cluster, t_hi = (rank + 1) * a.tiles / cluster;
  const int n_tiles = t_hi - t_lo;
  const int k_hi = t_hi * kt_cta < k ? t_hi * kt_cta : k;

  // The four weight rows of this lane (tiles mt = 0, 1; halves g, g + 8), as pointers at
  // k = kb + 8 t that advance with the loop (the chunks then sit at immediate offsets).
  // With silu_mul the CTA's first rows_cta / 2 local rows are gate rows and the rest the
  // matching up rows. Rows past n read row 0 (their sums are never stored).
  int kb = t_lo * kt_cta + wk * kt_w;
  const W* wptr[2][2];
  // quantized: the rows of the scales and zeros (row 0 past n)
  // (quantized: the element offsets of their rows in scales and zeros, row * groups, in 32
  // bits: the launcher checks that n * groups fits; a 64-bit pointer per row cost the
  // compiler its registers, and it recomputed each load's address in 8 instructions)
  uint32_t qrow[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int lr = kSmallMWarpRows * wr + 16 * mt + 8 * h + g;
      int64_t row;
      bool valid;
      if (silu) {
        const int hr = rows_cta / 2;
        const int64_t o = int64_t{blockIdx.y} * hr + (lr < hr ? lr : lr - hr);
        valid = o < half;
        row = (lr < hr ? 0 : half) + o;
      } else {
        row = int64_t{blockIdx.y} * rows_cta + lr;
        valid = row < p.n;
      }
      wptr[mt][h] = static_cast<const W*>(p.b) + (valid ? row : 0) * p.ldb + kLaneW * t + kb / kKPerW;
      qrow[mt][h] = static_cast<uint32_t>((valid ? row : 0) * a.groups);
    }
  (void)qrow;
  // Quantized: a load's scale pair (s, s) and zero pair (magic + z) of rows (mt, h), read
  // with the codes (0 for a load out of range: its codes then dequantize to 0, not NaN).
  // A load covers k [kq, kq + 32 CPL), one group (G is a multiple of 32 CPL).
  uint32_t qs[L][2][2], qz[L][2][2];
  (void)qs;
  (void)qz;
  const uint32_t zz_symmetric = kQuant ? dequant::zero_operand<T, kBits>(1u << (kBits - 1)) : 0u;
  auto load_group = [&](int l, int kq, bool pred) {
    if constexpr (kQuant) {
      const int gi = a.group_shift >= 0 ? kq >> a.group_shift : kq / a.group_size;
      const unsigned short* sg = static_cast<const unsigned short*>(a.scales) + gi;  // warp-uniform
      const uint8_t* zg = a.zeros + gi;
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t sv = pred ? __ldg(sg + qrow[mt][h]) : 0u;
          const uint32_t zv = a.zeros ? (pred ? __ldg(zg + qrow[mt][h]) : 0u) : 1u << (kBits - 1);
          if constexpr (kFoldZero) {  // s and -s (magic + z) in fp32 (both exact)
            const float sf = to_float(*reinterpret_cast<const T*>(&sv));
            qs[l][mt][h] = __float_as_uint(sf);
            qz[l][mt][h] = __float_as_uint(-sf * (dequant::QuantPair<T>::kMagicValue + static_cast<float>(zv)));
          } else {  // s in fp32 (kFold) or the pair (s, s); the pair (magic + z)
            qs[l][mt][h] = kFold ? __float_as_uint(to_float(*reinterpret_cast<const T*>(&sv)))
                                 : __byte_perm(sv, 0u, 0x1010u);
            qz[l][mt][h] = a.zeros ? dequant::zero_operand<T, kBits>(zv) : zz_symmetric;
          }
        }
    }
  };

  // The weight ring: w[l] holds load l of the current loop body (dense: chunk l, k = kb +
  // 32 l + 8 t; quantized: chunks CPL l .. CPL l + CPL - 1).
  const int lane_k = kQuant ? 0 : 8 * t;  // a quantized load is in range as a whole
  uint4 w[L][2][2];
  {
    const int rem = k_hi - kb - lane_k;  // load l is in range when 32 CPL l < rem
#pragma unroll
    for (int l = 0; l < L; ++l) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          w[l][mt][h] = small_m::load_weight(wptr[mt][h] + kSmallMChunk * CPL * l / kKPerW, kSmallMChunk * CPL * l < rem);
      load_group(l, kb + kSmallMChunk * CPL * l, kSmallMChunk * CPL * l < rem);
    }
  }

  // The x ring: stage s holds x[m0 .. m0 + kTokens, tile k range] chunk-major: chunk c
  // (32 k) of token i at elements (c * kTokens + i) * 32 .. + 32, so a lane's 16-byte
  // fragment (token 8 nt + g, k 8 t) is at a compile-time offset from a per-body base and
  // the LDS.128 of a quarter warp (tokens g, g + 1 at 16 t) covers 128 contiguous bytes:
  // no bank conflicts. Token rows past m_chunk stay zero; k past K is zero-filled.
  T* ring = reinterpret_cast<T*>(smem);
  const int stage_elems = a.stage_elems;
  const int chunks_cta = kt_cta / kSmallMChunk;
  const T* x = static_cast<const T*>(p.a);
  {
    const int pad_rows = kTokens - m_chunk;
    const int pad_vecs = chunks_cta * pad_rows * 4;
    for (int s = 0; s < kSmallMStages; ++s)
      for (int v = static_cast<int>(threadIdx.x); v < pad_vecs; v += nthreads) {
        const int c = v / (pad_rows * 4), r = v - c * pad_rows * 4;
        *reinterpret_cast<uint4*>(ring + s * stage_elems + (c * kTokens + m_chunk) * kSmallMChunk + 8 * r) =
            make_uint4(0, 0, 0, 0);
      }
  }
  // Vector v of a stage: 4 per (chunk, token) with t fastest, then the token, then the chunk.
  const int stage_vecs = chunks_cta * m_chunk * 4;
  auto issue_stage = [&](int tile) {  // tile relative to t_lo
    if (tile < n_tiles) {
      T* stage = ring + (tile % kSmallMStages) * stage_elems;
      const int k0 = (t_lo + tile) * kt_cta;
#pragma unroll 1
      for (int v = static_cast<int>(threadIdx.x); v < stage_vecs; v += nthreads) {
        const int q = v / 4, c = q / m_chunk, i = q - c * m_chunk;
        const int kk = k0 + c * kSmallMChunk + 8 * (v % 4);
        const bool ok = kk < k;
        const T* src = ok ? x + (m0 + i) * p.lda + kk : x;
        ptx::cp_async_16(ptx::smem_address(stage + (c * kTokens + i) * kSmallMChunk + 8 * (v % 4)), src, ok);
      }
    }
    ptx::cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < kSmallMStages - 1; ++s) issue_stage(s);

  // rmsnorm_linear: rstd of every token row from the sums of squares over the cluster's
  // CTAs (each sums its own k range), in fp32 as rmsnorm's kernel.
  constexpr bool norm = kNorm;
  if constexpr (norm) {
    const int k_lo = t_lo * kt_cta;
    for (int i = warp; i < m_chunk; i += nwarps) {
      const T* row = x + (m0 + i) * p.lda;
      float ss = 0.0f;
      for (int c = k_lo + 8 * lane; c < k_hi; c += 256) {
        const uint4 raw = *reinterpret_cast<const uint4*>(row + c);
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float f = to_float(e[j]);
          ss += f * f;
        }
      }
      ss = warp_sum(ss);
      if (lane == 0) norm_partial[i] = ss;
    }
    small_m::cluster_or_block_sync(cluster);
    for (int i = static_cast<int>(threadIdx.x); i < m_chunk; i += nthreads) {  // (a CTA may have 32 threads)
      float total = 0.0f;
      for (int c = 0; c < cluster; ++c) total += small_m::cluster_peer(norm_partial, c, cluster)[i];
      norm_rstd[i] = rsqrtf(total / static_cast<float>(k) + a.eps);
    }
    // (the barrier of the first tile publishes norm_rstd)
  }

  float acc[2][NT][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
  // kFold: the current load's unscaled sums (accl) and, kFoldZero, the sums of x over its k
  // span (xsum: every row of the ones product is the same; element e is token 2t + (e & 1)).
  float accl[kFold ? 2 : 1][NT][4];
  float xsum[NT][4];
  (void)accl;
  (void)xsum;
  constexpr uint32_t kOnes = 0x3F803F80u;  // (1, 1) in bf16

  // Per tile: a barrier (its x stage is complete, the previous one free), the next stage
  // issued, then bodies_per_tile bodies of this warp. `left` = k_hi minus this lane's k in
  // the current body (chunk j is in range when 32 j < left).
  const int xs_lane = (wk * kt_w / kSmallMChunk * kTokens + g) * kSmallMChunk + 8 * t;
  int stage_off = 0;  // elements from the ring's start to the current tile's stage
  int left = k_hi - kb - lane_k;
  for (int tile = 0; tile < n_tiles; ++tile) {
    ptx::cp_async_wait<kSmallMStages - 2>();
    __syncthreads();
    issue_stage(tile + kSmallMStages - 1);
    if constexpr (norm) {  // x -> round_T(x * rstd * g) in place, fp32 math, one rounding
      T* stage = ring + stage_off;
      const int k0 = (t_lo + tile) * kt_cta;
#pragma unroll 1
      for (int v = static_cast<int>(threadIdx.x); v < stage_vecs; v += nthreads) {
        const int q = v / 4, c = q / m_chunk, i = q - c * m_chunk;
        const int kk = k0 + c * kSmallMChunk + 8 * (v % 4);
        if (kk >= k) continue;
        uint4* ptr = reinterpret_cast<uint4*>(stage + (c * kTokens + i) * kSmallMChunk + 8 * (v % 4));
        uint4 raw = *ptr;
        T* e = reinterpret_cast<T*>(&raw);
        const float r = norm_rstd[i];
        float gv[8];
        small_m::load_norm_weight<T>(a, kk, gv);
#pragma unroll
        for (int j = 0; j < 8; ++j) e[j] = from_float<T>(to_float(e[j]) * r * gv[j]);
        *ptr = raw;
      }
      __syncthreads();
    }
    const T* xs = ring + stage_off + xs_lane;
    for (int sub = 0; sub < a.bodies_per_tile; ++sub, xs += kBodyK * kTokens) {
      // The next body: the next kBodyK of this warp's k range, or its range in the next tile.
      const int step = kBodyK + (sub + 1 == a.bodies_per_tile ? kt_cta - kt_w : 0);
      const int rem = left - step;
#pragma unroll
      for (int j = 0; j < U; ++j) {
        uint4 xv[NT];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          xv[nt] = small_m::load_x(xs + (j * kTokens + 8 * nt) * kSmallMChunk);
        if constexpr (kFold) {
          if (j % CPL == 0) {  // a load's first chunk: fresh partial sums
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                accl[0][nt][e] = accl[1][nt][e] = 0.0f;
                xsum[nt][e] = 0.0f;
              }
          }
          if constexpr (kFoldZero) {
            const uint32_t ones[4] = {kOnes, kOnes, kOnes, kOnes};
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              ptx::mma_16x8x16<T>(xsum[nt], ones, xv[nt].x, xv[nt].y);
              ptx::mma_16x8x16<T>(xsum[nt], ones, xv[nt].z, xv[nt].w);
            }
          }
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          // The fragment pairs of rows g (h = 0) and g + 8 (h = 1): elements 2p, 2p + 1 of the
          // lane's 8 k of chunk j.
          uint32_t d[2][4];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if constexpr (kQuant) {
              const uint4& q = w[j / CPL][mt][h];
              const uint32_t words[4] = {q.x, q.y, q.z, q.w};
              const uint32_t ss = qs[j / CPL][mt][h], zz = qz[j / CPL][mt][h];
              if constexpr (kFold)
                dequant::dequant_int4_unscaled<T>(words[j % CPL], zz, d[h]);
              else if constexpr (kBits == 4)
                dequant::dequant_int4<T>(words[j % CPL], zz, ss, d[h]);
              else
                dequant::dequant_int8<T>(words[2 * (j % CPL)], words[2 * (j % CPL) + 1], zz, ss, d[h]);
            } else {
              const uint4& v = w[j][mt][h];
              d[h][0] = v.x;
              d[h][1] = v.y;
              d[h][2] = v.z;
              d[h][3] = v.w;
            }
          }
          const uint32_t a0[4] = {d[0][0], d[1][0], d[0][1], d[1][1]};
          const uint32_t a1[4] = {d[0][2], d[1][2], d[0][3], d[1][3]};
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            float (&c)[4] = kFold ? accl[kFold ? mt : 0][nt] : acc[mt][nt];
            ptx::mma_16x8x16<T>(c, a0, xv[nt].x, xv[nt].y);
            ptx::mma_16x8x16<T>(c, a1, xv[nt].z, xv[nt].w);
          }
        }
        if (j % CPL == CPL - 1) {  // load j / CPL consumed: issue the next body's
          const int l = j / CPL;
          if constexpr (kFold) {  // acc += s * sum (q - z) x: s accl (+ -s (magic + z) xsum)
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
              for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                  acc[mt][nt][e] = fmaf(__uint_as_float(qs[l][mt][e >> 1]), accl[mt][nt][e], acc[mt][nt][e]);
                  if constexpr (kFoldZero)
                    acc[mt][nt][e] = fmaf(__uint_as_float(qz[l][mt][e >> 1]), xsum[nt][e], acc[mt][nt][e]);
                }
          }
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              w[l][mt][h] = small_m::load_weight(wptr[mt][h] + (step + kSmallMChunk * CPL * l) / kKPerW,
                                                 kSmallMChunk * CPL * l < rem);
          load_group(l, kb + step + kSmallMChunk * CPL * l, kSmallMChunk * CPL * l < rem);
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) wptr[mt][h] += step / kKPerW;
      kb += step;
      left = rem;
    }
    stage_off = stage_off + stage_elems == kSmallMStages * stage_elems ? 0 : stage_off + stage_elems;
  }

  // Partial tiles: red[wk][token][local row], pitch rows_cta + 4 floats (the fragment
  // stores of a warp, rows g + 8h and tokens 2t + pp, land in 32 distinct banks).
  ptx::cp_async_wait<0>();
  __syncthreads();  // every warp is done with the ring
  float* red = reinterpret_cast<float*>(smem);
  const int red_pitch = rows_cta + kSmallMRedPad;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int token = 8 * nt + 2 * t + (e & 1);
        const int lr = kSmallMWarpRows * wr + 16 * mt + 8 * (e >> 1) + g;
        red[(wk * kTokens + token) * red_pitch + lr] = acc[mt][nt][e];
      }
  small_m::cluster_or_block_sync(cluster);

  // Reduction and epilogue: this CTA finishes a 1/C slice of the output columns of the row
  // block, in groups of 4 columns, summing the partials of every CTA and warp group in a
  // fixed order (deterministic).
  const int out_rows = silu ? rows_cta / 2 : rows_cta;  // output columns of this row block
  const int groups = out_rows / 4;
  const int q_lo = rank * groups / cluster, q_hi = (rank + 1) * groups / cluster;
  const int q_count = q_hi - q_lo;
  const int64_t col_base = int64_t{blockIdx.y} * out_rows;
  const int64_t n_out = p.n_out();
  for (int idx = static_cast<int>(threadIdx.x); idx < q_count * m_chunk; idx += nthreads) {
    const int i = idx / q_count;
    const int o = 4 * (q_lo + idx - i * q_count);
    if (col_base + o >= n_out) continue;
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f), s_up = s;
    for (int c = 0; c < cluster; ++c) {
      const float* peer = small_m::cluster_peer(red, c, cluster);
      for (int part = 0; part < a.wk; ++part) {
        const float* base = peer + (part * kTokens + i) * red_pitch + o;
        const float4 v = *reinterpret_cast<const float4*>(base);
        s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
        if (silu) {
          const float4 u = *reinterpret_cast<const float4*>(base + out_rows);
          s_up.x += u.x; s_up.y += u.y; s_up.z += u.z; s_up.w += u.w;
        }
      }
    }
    const float sv[4] = {s.x, s.y, s.z, s.w}, uv[4] = {s_up.x, s_up.y, s_up.z, s_up.w};
    const int64_t row = m0 + i;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t col = col_base + o + e;
      if (col >= n_out) break;
      switch (p.out_dtype) {
        case DType::f32: small_m::store_out<float>(p, row, col, sv[e], uv[e]); break;
        case DType::f16: small_m::store_out<__half>(p, row, col, sv[e], uv[e]); break;
        case DType::bf16: small_m::store_out<__nv_bfloat16>(p, row, col, sv[e], uv[e]); break;
        default: break;
      }
    }
  }
  // Peers may still read this CTA's partials: leave only when the whole cluster is done.
  if (cluster > 1) small_m::cluster_or_block_sync(cluster);
}

}  // namespace llmk::detail
