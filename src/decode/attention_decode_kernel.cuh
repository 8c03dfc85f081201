// Decode attention over a (paged) KV cache on the sm_80 instruction set (cp.async,
// ldmatrix, mma.sync; it runs unchanged on Hopper, where the work is memory-bound).
//
// One block = one (sequence b, kv head, split of the keys, block of packed query rows).
// The query rows of a kv head are its q_len tokens x `group` query heads, packed as row
// r = token * group + head-in-group into 16-row mma tiles, so every query head of the
// group (and every speculative token) shares one pass over the kv head's keys and values.
//
//   load Q [kRows, D] (cp.async; RoPE applied in shared memory when asked)
//   a kStages-deep cp.async ring of key blocks: kBlockN = 64 keys of K and V per stage,
//   each key's row found through the block table (any page size, any page order)
//   for each key block: warp w takes keys [16 w, 16 w + 16) of the stage
//     new tokens (append): read from k_new / v_new, rotated, rounded (quantized for fp8),
//       written to the stage and, by the row-block-0 block, into the cache
//     fp8 cache: the warp's 16 K and V rows are converted to q's dtype in registers, straight
//       into the mma fragments (head dims 64, 128, 256; see decode_scores_fp8), or in shared
//       memory (head dim 96, the 64-row tile at 64)
//     S = Q K^T (mma.sync), mask (causal, split end), online softmax, O += P V
//   the 4 warps' (max, sum, O) merged through shared memory; the block writes out and lse
//   directly (one split); or, split over a thread-block cluster (2-8 splits on sm_90), keeps
//   its partial O and lse in shared memory, and after a cluster barrier each block combines a
//   1/C share of the rows from every block's shared memory (no workspace, no second kernel);
//   or (more splits) writes its partial O and lse into the workspace, which
//   attention_decode_merge_kernel combines by lse.
//
// Roofline (H100 SXM, ~3.0 TB/s copy): the bytes are the cache's K and V for the visible
// keys, 2 * seqlen_k * D * bytes per (sequence, kv head); q, out and the partials are
// < 1% of them at q_len <= 16. FLOPs are 4 * rows * seqlen_k * D per kv head, at most
// ~2 FLOP/byte for rows <= 16 (the tensor cores idle). A block keeps (kStages - 1) stages
// (35-70 KB) in flight; two blocks per SM (one at D = 256) give the 30+ KB per SM that
// covering the DRAM latency at 23 GB/s per SM needs. An fp8 cache moves half the bytes
// through the same loop; converted in registers (fp16 mma) it streams 3.3 TB/s of fp8 bytes
// on the H200 at batch 16-64 against the bf16 cache's 4.0 (1.6x the bf16 cache's speed, not
// 2x: per key the warps do the same mma and softmax work on half the bytes, plus the
// conversion). The 16-row fp8 tiles at head dim 96 convert in shared memory and run three
// blocks per SM (a 2-stage ring): 12 warps a SM convert faster than 8. Splits are chosen on the host
// (attention_decode.cu) so that the blocks fill the SMs in about one wave.
#pragma once

#include <cuda/ptx>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "common/device_types.cuh"
#include "common/fp8_e4m3.cuh"
#include "common/online_softmax.cuh"
#include "common/ptx.cuh"
#include "common/sm80/attention_tiles.cuh"
#include "decode/attention_decode_params.h"

namespace llmk::detail {

// The element of an fp8 (e4m3) cache on the device.
struct Fp8E4M3 {
  uint8_t bits;
};

constexpr int decode_max(int a, int b) { return a > b ? a : b; }
constexpr int decode_clamp(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Whether an fp8 cache's K and V are converted in registers straight into the mma fragments
// (decode_scores_fp8, decode_accumulate_pv_fp8), with no converted copy in shared memory: at
// head dims that are multiples of 64, but for the 64-row tile at head dim 64 (whose 128
// accumulators left the register path spilling). Head dim 96 and that tile convert in shared
// memory. (The launcher sizes the shared-memory budget by it too.)
constexpr bool decode_fp8_in_registers(int head_dim, int mtiles) {
  return head_dim % 64 == 0 && !(head_dim == 64 && mtiles == 4);
}

// The shape of one decode kernel: q's element type T, the cache's element type Cache (T
// or Fp8E4M3), the head dim, kMTiles 16-row query tiles per block, and the shared-memory
// budget of one block (two blocks per SM at 110 KB, one at 220 KB, three at 75 KB) that sets
// the ring depth. kVariants_: the score variants (window, softcap, sinks) compiled in; the
// kernels of plain calls carry none of their instructions (16-row tiles only).
template <class T, class Cache_, int kHeadDim_, int kMTiles_, int kSmemBudget, bool kVariants_ = false>
struct DecodeTile {
  using Cache = Cache_;
  static constexpr int kHeadDim = kHeadDim_, kMTiles = kMTiles_;
  static constexpr bool kVariants = kVariants_;
  static_assert(!kVariants || kMTiles == 1, "the score variants are compiled into the 16-row tiles only");
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kWarpKeys = 16, kBlockN = kWarps * kWarpKeys;
  static constexpr int kRows = 16 * kMTiles;
  static constexpr bool kFp8 = std::is_same_v<Cache, Fp8E4M3>;
  static constexpr bool kRegisterFp8 = kFp8 && decode_fp8_in_registers(kHeadDim_, kMTiles_);
  // A 16-row tile up to head dim 128 (a cache like q's, or fp8 on the register path) holds
  // its Q fragments in registers for the whole pass (D / 4 of them) instead of reading them
  // from shared memory every stage.
  static constexpr bool kQInRegisters = (kRegisterFp8 || !kFp8) && kMTiles_ == 1 && kHeadDim_ <= 128;
  // The per-warp mma tile: all kRows rows against the warp's 16 keys.
  using WarpTile = ForwardTile<kHeadDim, kRows, kWarpKeys, 1>;
  static constexpr int kPitch = WarpTile::kPitch;  // T elements per Q / converted row (+16 bytes)
  static constexpr int kCacheRowBytes = kHeadDim * static_cast<int>(sizeof(Cache));
  static constexpr int kStageRowBytes = kCacheRowBytes + 16;
  static constexpr int kStageBytes = 2 * kBlockN * kStageRowBytes;  // K rows, then V rows
  static constexpr int kConvertBytes =
      kFp8 && !kRegisterFp8 ? kWarps * 2 * kWarpKeys * kPitch * static_cast<int>(sizeof(T)) : 0;
  static constexpr int kQBytes = kRows * kPitch * static_cast<int>(sizeof(T));
  static constexpr int kStages = decode_clamp((kSmemBudget - kQBytes - kConvertBytes) / kStageBytes, 2, 4);
  static constexpr int kMergePitch = kHeadDim + 8;  // floats per row of a warp's O
  static constexpr int kMergeBytes = kWarps * kRows * kMergePitch * 4;
  static constexpr int kSmemBytes = kQBytes + decode_max(kStages * kStageBytes + kConvertBytes, kMergeBytes);
  static constexpr int kCacheChunks = kCacheRowBytes / 16;  // 16-byte pieces of a cache row
  // Blocks per SM asked of ptxas: three where the budget allows them (it then keeps the
  // registers at 170), else one (up to 255 registers; two blocks still fit).
  static constexpr int kMinBlocks = kSmemBudget * 3 <= 228 * 1024 ? 3 : 1;
  static_assert((kBlockN * kCacheChunks) % kThreads == 0 && kHeadDim % 32 == 0);
  // Three blocks per SM still fit with the kernel's static shared memory (s_max, s_sum,
  // s_lse) and the 1 KB the SM reserves per block (228 KB per SM on sm_90).
  static_assert(kMinBlocks != 3 || 3 * (kSmemBytes + (2 * kWarps + 1) * kRows * 4 + 1024) <= 228 * 1024,
                "three blocks of this tile no longer fit an SM");
};

// The most dynamic shared memory an sm_8x GPU gives a block (A100's opt-in limit; sm_86 and
// sm_89 give 99 KB). A tile above it (head dim 256, one block per SM) has machine code for
// sm_90 alone: its sm_80 body is empty (the compile of that pass shrinks by the kernel),
// and the launcher rejects it where the code that would run was compiled for sm_8x.
inline constexpr int kSm80MaxSmemPerBlock = 163 * 1024;

template <class Tile>
__host__ __device__ constexpr bool decode_tile_compiled_here() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  return Tile::kSmemBytes <= kSm80MaxSmemPerBlock;
#else
  return true;
#endif
}

__device__ __forceinline__ int ceil_div_int(int a, int b) { return (a + b - 1) / b; }

// RoPE of pair `pair` of a head vector at `pos`: the pair's element indices (NeoX
// (i, i + rotary_dim / 2) or GPT-J (2i, 2i + 1)) and the rotated values of (x1, x2). A
// position outside the cos/sin cache gives NaN, as rope_ does.
__device__ __forceinline__ void rope_pair_index(const DecodeParams& p, int pair, int& i1, int& i2) {
  i1 = p.rotary_interleaved ? 2 * pair : pair;
  i2 = p.rotary_interleaved ? 2 * pair + 1 : pair + p.rotary_dim / 2;
}

__device__ __forceinline__ float2 rope_pair(const DecodeParams& p, float x1, float x2, int pair, int pos) {
  if (pos < 0 || pos >= p.rotary_max_pos) return make_float2(__int_as_float(0x7fc00000), __int_as_float(0x7fc00000));
  const float* cs = p.rotary_cos_sin + static_cast<int64_t>(pos) * p.rotary_dim;
  const float c = cs[pair], s = cs[p.rotary_dim / 2 + pair];
  return make_float2(x1 * c - x2 * s, x2 * c + x1 * s);
}

template <class Cache, class T>
__device__ __forceinline__ Cache to_cache(float v, float scale) {
  if constexpr (std::is_same_v<Cache, Fp8E4M3>) {
    return Fp8E4M3{static_cast<uint8_t>(__nv_cvt_float_to_fp8(to_float(from_float<T>(v)) / scale, __NV_SATFINITE, __NV_E4M3))};
  } else {
    return from_float<T>(v);
  }
}

// 16 e4m3 values (one uint4) as 16 T values (two uint4): exact, e4m3 fits both fp16 and bf16.
template <class T>
__device__ __forceinline__ void fp8x16_to(uint4 (&dst)[2], uint4 src) {
  const uint32_t words[4] = {src.x, src.y, src.z, src.w};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const __half2 h = e4m3x2_to_half2(words[i / 2] >> (16 * (i % 2)));
    if constexpr (std::is_same_v<T, __half>) {
      out[i] = *reinterpret_cast<const uint32_t*>(&h);
    } else {
      const float2 f = __half22float2(h);
      out[i] = ptx::pack2<T>(f.x, f.y);
    }
  }
  dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
  dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

// Two e4m3 values (bytes 0 and 1 of `pair`, byte 0 the lower element) as the bits of an
// fp16 pair: exact.
__device__ __forceinline__ uint32_t fp8x2_to_f16x2(uint32_t pair) {
  const __half2 h = e4m3x2_to_half2(pair);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The fp8 register path multiplies in fp16 whatever q's dtype: e4m3 -> fp16 is one
// instruction a pair (cvt.rn.f16x2.e4m3x2), e4m3 -> bf16 four (through fp32). A bf16 q is
// stored in shared memory as fp16 times 2^-8 (decode_q_to_fp16: exact but below 2^-6, where
// fp16 subnormals keep 2^-16 of absolute precision, negligible beside the dot product's
// bf16 rounding; no overflow below |q| = 2^24), and the scores are scaled back by 2^8; the
// probabilities P (in [0, 1]) are rounded to fp16, finer than bf16.
template <class T>
inline constexpr float kFp8QScaleBack = std::is_same_v<T, __half> ? 1.0f : 256.0f;

// A bf16 Q tile in shared memory (kRows x kHeadDim at pitch kPitch) rewritten in place as
// fp16 times 2^-8 (see kFp8QScaleBack), by the block's threads.
template <class T, class Tile>
__device__ __forceinline__ void decode_q_to_fp16(T* sQ, int tid) {
  static_assert(std::is_same_v<T, __nv_bfloat16>);
  constexpr int kPairs = Tile::kHeadDim / 2;
  for (int item = tid; item < Tile::kRows * kPairs; item += Tile::kThreads) {
    uint32_t* pair = reinterpret_cast<uint32_t*>(sQ + (item / kPairs) * Tile::kPitch) + item % kPairs;
    const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(pair));
    *pair = ptx::pack2<__half>(x.x * (1.0f / 256.0f), x.y * (1.0f / 256.0f));
  }
}

// Q's fragments of one 16-row tile, k16 step by step (held for the block's pass where
// Tile::kQInRegisters): in scores()' order for a cache like q's, in the permuted head-dim
// order of decode_scores_fp8 for an fp8 cache.
template <class Tile>
struct DecodeQFragments {
  uint32_t a[Tile::kQInRegisters ? Tile::kHeadDim / 16 : 1][4];
};

// Q's A fragments for k16 step 4 q + st of row tile mt: lane (g, t) reads d = 64 q + 16 t +
// 4 st + (0, 1 | 2, 3) of rows g and g + 8 (fp16 in shared memory on this path).
template <class T, class Tile>
__device__ __forceinline__ void decode_q_fragment_fp8(uint32_t (&a)[4], const T* sQ, int mt, int q, int st, int lane) {
  const int g = lane / 4, t = lane % 4;
  const T* q0 = sQ + (16 * mt + g) * Tile::kPitch + 64 * q + 16 * t + 4 * st;
  const T* q1 = q0 + 8 * Tile::kPitch;
  a[0] = *reinterpret_cast<const uint32_t*>(q0);
  a[1] = *reinterpret_cast<const uint32_t*>(q1);
  a[2] = *reinterpret_cast<const uint32_t*>(q0 + 2);
  a[3] = *reinterpret_cast<const uint32_t*>(q1 + 2);
}

template <class T, class Tile>
__device__ __forceinline__ void decode_load_q_fragments_fp8(DecodeQFragments<Tile>& f, const T* sQ, int lane) {
#pragma unroll
  for (int step = 0; step < Tile::kHeadDim / 16; ++step)
    decode_q_fragment_fp8<T, Tile>(f.a[step], sQ, 0, step / 4, step % 4, lane);
}

// Q's fragments for a cache like q's: ldmatrix of the 16 x 16 blocks as scores() reads them.
template <class T, class Tile>
__device__ __forceinline__ void decode_load_q_fragments(DecodeQFragments<Tile>& f, const T* sQ, int lane) {
  const uint32_t q_lane = ptx::smem_address(sQ + (lane & 15) * Tile::kPitch + (lane >> 4) * 8);
#pragma unroll
  for (int ks = 0; ks < Tile::kHeadDim / 16; ++ks) ptx::ldmatrix_x4(f.a[ks], q_lane + ks * 32);
}

// s = Q K^T for the warp's 16 keys of a cache like q's, Q's fragments from registers and K's
// by ldmatrix from the stage (scores() with the Q loads hoisted out of the key loop).
template <class T, class Tile>
__device__ __forceinline__ void decode_scores_q_in_registers(float (&s)[1][2][4], const DecodeQFragments<Tile>& qf,
                                                             const T* sK, int lane) {
  static_assert(Tile::kMTiles == 1 && Tile::kWarpKeys == 16);
  const uint32_t k_lane = ptx::smem_address(sK + ((lane & 7) + (lane >> 4) * 8) * Tile::kPitch + ((lane >> 3) & 1) * 8);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) s[0][nt][0] = s[0][nt][1] = s[0][nt][2] = s[0][nt][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < Tile::kHeadDim / 16; ++ks) {
    uint32_t b[4];
    ptx::ldmatrix_x4(b, k_lane + ks * 32);
    ptx::mma_16x8x16<T>(s[0][0], qf.a[ks], b[0], b[1]);
    ptx::mma_16x8x16<T>(s[0][1], qf.a[ks], b[2], b[3]);
  }
}

// s = Q K^T for the warp's 16 keys, K read as fp8 from the stage (rows of kStageRowBytes at
// k_rows) and converted in registers into fp16 B fragments (Q fp16 in shared memory, see
// kFp8QScaleBack). The head dim is taken in a permuted order shared by both operands (a dot
// product does not depend on the order of its terms): k16 step 4 q + st's mma k indices
// (2 t, 2 t + 1) and (2 t + 8, 2 t + 9) of lane (g = lane / 4, t = lane % 4) are d = 64 q +
// 16 t + 4 st + (0, 1) and (2, 3). A lane's K bytes for four steps are then 16 contiguous
// bytes of a key row (one 16-byte load), and its Q fragments two 4-byte reads of a Q row.
template <class T, class Tile>
__device__ __forceinline__ void decode_scores_fp8(float (&s)[Tile::kMTiles][2][4], const T* sQ,
                                                  const DecodeQFragments<Tile>& qf, const unsigned char* k_rows,
                                                  int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
  for (int q = 0; q < Tile::kHeadDim / 64; ++q) {
    uint4 kw[2];  // key rows g and 8 + g: d = 64 q + 16 t .. + 15
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
      kw[nt] = *reinterpret_cast<const uint4*>(k_rows + (8 * nt + g) * Tile::kStageRowBytes + 64 * q + 16 * t);
#pragma unroll
    for (int st = 0; st < 4; ++st) {
      uint32_t a[Tile::kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < Tile::kMTiles; ++mt) {
        if constexpr (Tile::kQInRegisters) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a[mt][i] = qf.a[4 * q + st][i];
        } else {
          decode_q_fragment_fp8<T, Tile>(a[mt], sQ, mt, q, st, lane);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const uint32_t word = st == 0 ? kw[nt].x : st == 1 ? kw[nt].y : st == 2 ? kw[nt].z : kw[nt].w;
        const uint32_t b0 = fp8x2_to_f16x2(word), b1 = fp8x2_to_f16x2(word >> 16);
#pragma unroll
        for (int mt = 0; mt < Tile::kMTiles; ++mt) ptx::mma_16x8x16<__half>(s[mt][nt], a[mt], b0, b1);
      }
    }
  }
  if constexpr (kFp8QScaleBack<T> != 1.0f) {
#pragma unroll
    for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) s[mt][nt][c] *= kFp8QScaleBack<T>;
  }
}

// The column of O that element `n` of the warp's d-tile `j` holds on the fp8 register path:
// lane g's B fragments take d-tile j's column g from d = (D / 8) g + j, so that a lane's V
// bytes of a key row are D / 8 contiguous ones.
template <int kHeadDim>
__device__ __forceinline__ int decode_fp8_o_column(int j, int n) {
  return (kHeadDim / 8) * n + j;
}

// o += P V for the warp's 16 keys, V read as fp8 from the stage (rows at v_rows) and
// converted in registers to fp16 (P too): lane (g, t) loads the D / 8 bytes from (D / 8) g
// of key rows 2 t, 2 t + 1, 2 t + 8, 2 t + 9; d-tile j's B fragment is byte j of those rows,
// paired by byte permutes (rows 2 t and 2 t + 1, then 2 t + 8 and 2 t + 9). O's columns
// come out in the order of decode_fp8_o_column.
template <class T, class Tile>
__device__ __forceinline__ void decode_accumulate_pv_fp8(float (&o)[Tile::kMTiles][Tile::kHeadDim / 8][4],
                                                         const float (&p)[Tile::kMTiles][2][4],
                                                         const unsigned char* v_rows, int lane) {
  constexpr int D = Tile::kHeadDim, kLaneBytes = D / 8, kWords = kLaneBytes / 4;
  constexpr int kChunkWords = kWords < 4 ? kWords : 4;  // one load of a row: 8 or 16 bytes
  const int g = lane / 4, t = lane % 4;
  uint32_t a[Tile::kMTiles][4];
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt) {
    a[mt][0] = ptx::pack2<__half>(p[mt][0][0], p[mt][0][1]);
    a[mt][1] = ptx::pack2<__half>(p[mt][0][2], p[mt][0][3]);
    a[mt][2] = ptx::pack2<__half>(p[mt][1][0], p[mt][1][1]);
    a[mt][3] = ptx::pack2<__half>(p[mt][1][2], p[mt][1][3]);
  }
  const int rows[4] = {2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9};
#pragma unroll
  for (int c = 0; c < kWords / kChunkWords; ++c) {
    uint32_t w[4][kChunkWords];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const unsigned char* src = v_rows + rows[r] * Tile::kStageRowBytes + kLaneBytes * g + 4 * kChunkWords * c;
      if constexpr (kChunkWords == 4) {
        const uint4 v = *reinterpret_cast<const uint4*>(src);
        w[r][0] = v.x;
        w[r][1] = v.y;
        w[r][2] = v.z;
        w[r][3] = v.w;
      } else {
        const uint2 v = *reinterpret_cast<const uint2*>(src);
        w[r][0] = v.x;
        w[r][1] = v.y;
      }
    }
#pragma unroll
    for (int i = 0; i < kChunkWords; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = 4 * (kChunkWords * c + i) + e;  // the d-tile: byte j of the lane's bytes
        const uint32_t select = static_cast<uint32_t>(e | ((4 + e) << 4));
        const uint32_t b0 = fp8x2_to_f16x2(__byte_perm(w[0][i], w[1][i], select));
        const uint32_t b1 = fp8x2_to_f16x2(__byte_perm(w[2][i], w[3][i], select));
#pragma unroll
        for (int mt = 0; mt < Tile::kMTiles; ++mt) ptx::mma_16x8x16<__half>(o[mt][j], a[mt], b0, b1);
      }
  }
}

// The combine of a cluster's splits (sm_90; the launcher asks for it only there): the
// cluster is the gridDim.x = p.splits blocks of one (sequence, kv head, row block), each
// holding its normalized partial rows (pitch kMergePitch floats) and their lse in shared
// memory. After a cluster barrier, block `split` takes a 1/C share of the (row, 4 columns)
// items and reads every block's piece through distributed shared memory: out = sum_s
// exp(lse_s - lse) O_s, lse = log sum_s exp(lse_s) (a split that saw no key has lse -inf
// and weighs nothing), in a fixed order. A second barrier keeps each block's shared memory
// alive until its peers have read it.
template <class T, class Tile>
__device__ __forceinline__ void decode_cluster_merge(const DecodeParams& p, const float* s_o, const float* s_lse, int b,
                                                     int kv_head, int row0, int rows_total) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int D = Tile::kHeadDim;
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
  cuda::ptx::barrier_cluster_wait();
  const int splits = p.splits, split = static_cast<int>(blockIdx.x);
  const int rows = min(Tile::kRows, rows_total - row0);
  for (int item = split * Tile::kThreads + static_cast<int>(threadIdx.x); item < rows * (D / 4);
       item += splits * Tile::kThreads) {
    const int r = item / (D / 4), c = (item % (D / 4)) * 4;
    const int gr = row0 + r, token = gr / p.group, head = kv_head * p.group + gr % p.group;
    // An attention sink joins the merged denominator once (natural log units, as the lse).
    const float sink = Tile::kVariants && p.variants.sinks ? p.variants.sinks[head] : -INFINITY;
    float m = sink;
    for (int s = 0; s < splits; ++s)
      m = fmaxf(m, static_cast<const float*>(__cluster_map_shared_rank(const_cast<float*>(s_lse), s))[r]);
    float sum = sink == -INFINITY ? 0.0f : ptx::exp2_approx((sink - m) * 1.4426950408889634f);
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s = 0; s < splits; ++s) {
      const float ls = static_cast<const float*>(__cluster_map_shared_rank(const_cast<float*>(s_lse), s))[r];
      if (ls == -INFINITY) continue;
      const float weight = ptx::exp2_approx((ls - m) * 1.4426950408889634f);
      const float4 o = *reinterpret_cast<const float4*>(
          static_cast<const float*>(__cluster_map_shared_rank(const_cast<float*>(s_o), s)) + r * Tile::kMergePitch + c);
      sum += weight;
      acc.x += weight * o.x;
      acc.y += weight * o.y;
      acc.z += weight * o.z;
      acc.w += weight * o.w;
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    T* dst = static_cast<T*>(p.out.data) + b * p.out.batch_stride + token * p.out.row_stride +
             head * p.out.head_stride + c;
    *reinterpret_cast<uint2*>(dst) =
        make_uint2(ptx::pack2<T>(acc.x * inv, acc.y * inv), ptx::pack2<T>(acc.z * inv, acc.w * inv));
    if (c == 0 && p.lse)
      p.lse[(static_cast<int64_t>(b) * p.heads_q + head) * p.q_len + token] = sum > 0.0f ? m + logf(sum) : -INFINITY;
  }
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);  // this block's reads of its peers are done
  cuda::ptx::barrier_cluster_wait();
#else
  (void)p, (void)s_o, (void)s_lse, (void)b, (void)kv_head, (void)row0, (void)rows_total;
#endif
}

// grid (splits, heads_kv * row blocks, batch), Tile::kThreads threads, Tile::kSmemBytes of
// dynamic shared memory. The explicit minimum of one block per SM (Tile::kMinBlocks, but for
// the three-per-SM fp8 tiles) lets ptxas use up to 255 registers (two blocks of 128 threads
// still fit); without it ptxas settled at 128 for several variants and spilled 4-36 bytes.
template <class T, class Tile>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocks) attention_decode_kernel(const __grid_constant__ DecodeParams p) {
  if constexpr (!decode_tile_compiled_here<Tile>()) return;
  using Cache = typename Tile::Cache;
  constexpr int D = Tile::kHeadDim, kRows = Tile::kRows, kBlockN = Tile::kBlockN, kStages = Tile::kStages;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  unsigned char* ring = smem + Tile::kQBytes;
  T* convert = reinterpret_cast<T*>(ring + kStages * Tile::kStageBytes);
  __shared__ float s_max[Tile::kWarps][kRows], s_sum[Tile::kWarps][kRows];
  __shared__ float s_lse[kRows];  // cluster merge: this split's lse per row

  const int split = static_cast<int>(blockIdx.x);
  const int kv_head = static_cast<int>(blockIdx.y) % p.heads_kv;
  const int row_block = static_cast<int>(blockIdx.y) / p.heads_kv;
  const int b = static_cast<int>(blockIdx.z);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;

  const int seqlen_k = decode_seqlen_k(p, b);
  const bool append = p.k_new.data != nullptr;
  const int first_new = append ? seqlen_k - p.q_len : seqlen_k;  // keys from here come from k_new
  // With a sliding window the splits share the keys from the first token's window on (the
  // keys before it are seen by no row).
  const int window_begin = Tile::kVariants && p.variants.window > 0 ? max(0, seqlen_k - p.q_len + 1 - p.variants.window) : 0;
  const int chunk = ceil_div_int(ceil_div_int(seqlen_k - window_begin, p.splits), kBlockN) * kBlockN;
  const int key_begin = min(window_begin + split * chunk, seqlen_k), key_end = min(key_begin + chunk, seqlen_k);
  const int n_blocks = ceil_div_int(key_end - key_begin, kBlockN);
  const int rows_total = p.q_len * p.group, row0 = row_block * kRows;
  const float k_scale = Tile::kFp8 ? p.k.scale[kv_head] : 1.0f;
  const float scale_log2 = p.scale_log2 * k_scale;

  // Q rows, zero past the packed rows.
  {
    constexpr int kChunks = D / 8;
    for (int c = tid; c < kRows * kChunks; c += Tile::kThreads) {
      const int r = c / kChunks, col = (c % kChunks) * 8, gr = row0 + r;
      const bool valid = gr < rows_total;
      const int token = valid ? gr / p.group : 0, head = kv_head * p.group + (valid ? gr % p.group : 0);
      const T* src = static_cast<const T*>(p.q.data) + b * p.q.batch_stride + token * p.q.row_stride +
                     head * p.q.head_stride + col;
      ptx::cp_async_16(ptx::smem_address(sQ + r * Tile::kPitch + col), src, valid);
    }
  }

  // Stage j of the ring: keys [key_begin + j kBlockN, + kBlockN) of K and V, zero rows
  // past the split's end and for the new tokens (written by the warps from k_new / v_new).
  const int load_end = min(key_end, first_new);
  // Each thread loads one 16-byte column piece of rows r0, r0 + kRowsPerPass, ...: its
  // column pointers are fixed, and in a contiguous cache the rows are pointer increments.
  constexpr int kRowsPerPass = prev_power_of_two(Tile::kThreads / Tile::kCacheChunks);
  static_assert(kBlockN % kRowsPerPass == 0);
  const bool loads = tid < kRowsPerPass * Tile::kCacheChunks;
  const int r0 = tid / Tile::kCacheChunks, col = (tid % Tile::kCacheChunks) * 16;
  const unsigned char* k_col = static_cast<const unsigned char*>(p.k.data) + kv_head * p.k.head_stride * sizeof(Cache) + col;
  const unsigned char* v_col = static_cast<const unsigned char*>(p.v.data) + kv_head * p.v.head_stride * sizeof(Cache) + col;
  const uint32_t dst0 = ptx::smem_address(ring + r0 * Tile::kStageRowBytes + col);
  auto issue = [&](int j) {
    if (!loads) return;
    const uint32_t dst = dst0 + (j % kStages) * Tile::kStageBytes;
    const int key0 = key_begin + j * kBlockN + r0;
    if (p.block_table == nullptr) {
      const unsigned char* k_src = k_col + (b * p.k.page_stride + key0 * p.k.row_stride) * sizeof(Cache);
      const unsigned char* v_src = v_col + (b * p.v.page_stride + key0 * p.v.row_stride) * sizeof(Cache);
      const int64_t k_step = kRowsPerPass * p.k.row_stride * sizeof(Cache);
      const int64_t v_step = kRowsPerPass * p.v.row_stride * sizeof(Cache);
#pragma unroll
      for (int i = 0; i < kBlockN / kRowsPerPass; ++i) {
        const bool valid = key0 + i * kRowsPerPass < load_end;
        const uint32_t row_dst = dst + i * kRowsPerPass * Tile::kStageRowBytes;
        ptx::cp_async_16(row_dst, valid ? k_src : k_col, valid);
        ptx::cp_async_16(row_dst + kBlockN * Tile::kStageRowBytes, valid ? v_src : v_col, valid);
        k_src += k_step;
        v_src += v_step;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kBlockN / kRowsPerPass; ++i) {
        const int key = key0 + i * kRowsPerPass;
        const bool valid = key < load_end;
        const DecodeCacheSlot slot = decode_cache_slot(p, b, valid ? key : 0);
        const uint32_t row_dst = dst + i * kRowsPerPass * Tile::kStageRowBytes;
        ptx::cp_async_16(row_dst, k_col + decode_cache_row(p.k, slot) * sizeof(Cache), valid);
        ptx::cp_async_16(row_dst + kBlockN * Tile::kStageRowBytes, v_col + decode_cache_row(p.v, slot) * sizeof(Cache),
                         valid);
      }
    }
  };

  // The key (exclusive) where masking starts for each of the thread's rows.
  int row_end[Tile::kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int gr = row0 + mt * 16 + half * 8 + lane / 4;
      const int token = gr < rows_total ? gr / p.group : p.q_len - 1;
      row_end[mt][half] = min(key_end, decode_visible_keys(p, seqlen_k, token));
    }
  const int mask_from = p.causal ? min(key_end, seqlen_k - p.q_len + 1) : key_end;

  float o[Tile::kMTiles][Tile::kHeadDim / 8][4];
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.0f;
  OnlineSoftmax<Tile::kMTiles> softmax;
  DecodeQFragments<Tile> qf;  // the fp8 register path's Q fragments (Tile::kQInRegisters)

  // One cp.async group for Q, then one per stage (empty ones too): waiting for all but
  // the newest kStages - 2 groups lands Q and stages 0..j.
  ptx::cp_async_commit();
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (j < n_blocks) issue(j);
    ptx::cp_async_commit();
  }
  for (int j = 0; j < n_blocks; ++j) {
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();  // stage j (and Q) landed; every warp is done with stage j - 1's slot
    if (j == 0 && p.rotary_cos_sin != nullptr) {  // rotate the Q rows in place, pair by pair
      const int pairs = p.rotary_dim / 2;
      for (int item = tid; item < kRows * pairs; item += Tile::kThreads) {
        const int r = item / pairs, pair = item % pairs, gr = row0 + r;
        if (gr >= rows_total) break;
        int i1, i2;
        rope_pair_index(p, pair, i1, i2);
        T* x = sQ + r * Tile::kPitch;
        const float2 y = rope_pair(p, to_float(x[i1]), to_float(x[i2]), pair, seqlen_k - p.q_len + gr / p.group);
        x[i1] = from_float<T>(y.x);
        x[i2] = from_float<T>(y.y);
      }
      __syncthreads();
    }
    if constexpr (Tile::kRegisterFp8 && !std::is_same_v<T, __half>) {
      if (j == 0) {  // after RoPE: the fp8 register path's fp16 Q
        decode_q_to_fp16<T, Tile>(sQ, tid);
        __syncthreads();
      }
    }
    if constexpr (Tile::kQInRegisters) {
      if (j == 0) {
        if constexpr (Tile::kFp8) decode_load_q_fragments_fp8<T, Tile>(qf, sQ, lane);
        else decode_load_q_fragments<T, Tile>(qf, sQ, lane);
      }
    }
    if (j + kStages - 1 < n_blocks) issue(j + kStages - 1);
    ptx::cp_async_commit();

    unsigned char* stage = ring + (j % kStages) * Tile::kStageBytes;
    const int warp_key0 = key_begin + j * kBlockN + warp * Tile::kWarpKeys;
    if (warp_key0 >= key_end) continue;  // past the split's end: nothing for this warp
    unsigned char* k_rows = stage + warp * Tile::kWarpKeys * Tile::kStageRowBytes;
    unsigned char* v_rows = k_rows + kBlockN * Tile::kStageRowBytes;

    // New tokens among this warp's keys: from k_new / v_new into the stage (and the cache).
    if (append && warp_key0 + Tile::kWarpKeys > first_new) {
      const int t_end = min(warp_key0 + Tile::kWarpKeys, key_end);
      for (int t = max(warp_key0, first_new); t < t_end; ++t) {
        const int token = t - first_new;
        const T* kn = static_cast<const T*>(p.k_new.data) + b * p.k_new.batch_stride + token * p.k_new.row_stride +
                      kv_head * p.k_new.head_stride;
        const T* vn = static_cast<const T*>(p.v_new.data) + b * p.v_new.batch_stride + token * p.v_new.row_stride +
                      kv_head * p.v_new.head_stride;
        const DecodeCacheSlot slot = decode_cache_slot(p, b, t);
        Cache* k_dst = static_cast<Cache*>(p.k.data) + decode_cache_row(p.k, slot) + kv_head * p.k.head_stride;
        Cache* v_dst = static_cast<Cache*>(p.v.data) + decode_cache_row(p.v, slot) + kv_head * p.v.head_stride;
        Cache* k_stage = reinterpret_cast<Cache*>(k_rows + (t - warp_key0) * Tile::kStageRowBytes);
        Cache* v_stage = reinterpret_cast<Cache*>(v_rows + (t - warp_key0) * Tile::kStageRowBytes);
        const float v_scale = Tile::kFp8 ? p.v.scale[kv_head] : 1.0f;
        auto put = [&](Cache* stage_row, Cache* cache_row, int e, Cache value) {
          stage_row[e] = value;
          if (row_block == 0) cache_row[e] = value;
        };
        const int rotated = p.rotary_cos_sin != nullptr ? p.rotary_dim : 0;
        for (int pair = lane; pair < rotated / 2; pair += 32) {
          int i1, i2;
          rope_pair_index(p, pair, i1, i2);
          const float2 y = rope_pair(p, to_float(kn[i1]), to_float(kn[i2]), pair, t);
          put(k_stage, k_dst, i1, to_cache<Cache, T>(y.x, k_scale));
          put(k_stage, k_dst, i2, to_cache<Cache, T>(y.y, k_scale));
        }
        for (int e = rotated + lane; e < D; e += 32) put(k_stage, k_dst, e, to_cache<Cache, T>(to_float(kn[e]), k_scale));
        for (int e = lane; e < D; e += 32) put(v_stage, v_dst, e, to_cache<Cache, T>(to_float(vn[e]), v_scale));
      }
      __syncwarp();
    }

    const T* sK = nullptr;
    const T* sV = nullptr;
    if constexpr (Tile::kRegisterFp8) {
      // converted in registers by decode_scores_fp8 / decode_accumulate_pv_fp8
    } else if constexpr (Tile::kFp8) {
      T* k_conv = convert + warp * 2 * Tile::kWarpKeys * Tile::kPitch;
      T* v_conv = k_conv + Tile::kWarpKeys * Tile::kPitch;
      constexpr int kChunks = Tile::kWarpKeys * D / 16;  // 16 fp8 values each
#pragma unroll
      for (int i = 0; i < kChunks / 32; ++i) {
        const int c = lane + 32 * i, r = c / (D / 16), col = (c % (D / 16)) * 16;
        uint4 k16[2], v16[2];
        fp8x16_to<T>(k16, *reinterpret_cast<const uint4*>(k_rows + r * Tile::kStageRowBytes + col));
        fp8x16_to<T>(v16, *reinterpret_cast<const uint4*>(v_rows + r * Tile::kStageRowBytes + col));
        *reinterpret_cast<uint4*>(k_conv + r * Tile::kPitch + col) = k16[0];
        *reinterpret_cast<uint4*>(k_conv + r * Tile::kPitch + col + 8) = k16[1];
        *reinterpret_cast<uint4*>(v_conv + r * Tile::kPitch + col) = v16[0];
        *reinterpret_cast<uint4*>(v_conv + r * Tile::kPitch + col + 8) = v16[1];
      }
      __syncwarp();
      sK = k_conv;
      sV = v_conv;
    } else {
      sK = reinterpret_cast<const T*>(k_rows);
      sV = reinterpret_cast<const T*>(v_rows);
    }

    float s[Tile::kMTiles][2][4];
    if constexpr (Tile::kRegisterFp8) decode_scores_fp8<T, Tile>(s, sQ, qf, k_rows, lane);
    else if constexpr (Tile::kQInRegisters) decode_scores_q_in_registers<T, Tile>(s, qf, sK, lane);
    else scores<T, typename Tile::WarpTile>(s, sQ, sK, 0, lane);
    // The softcap on the true scores scale * k_scale * s (raw s here).
    if (Tile::kVariants && p.variants.softcap > 0.0f)
      softcap_scores(s, p.variants.softcap / (p.scale * k_scale), p.scale * k_scale / p.variants.softcap);
    // (with a window, the keys below the last token's window start, seqlen_k - window, need
    // the left mask of some row; p.variants.window is read from the parameters, not held)
    if (warp_key0 + Tile::kWarpKeys > mask_from ||
        (Tile::kVariants && p.variants.window > 0 && warp_key0 < seqlen_k - p.variants.window)) {
#pragma unroll
      for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          // The row's window start, recomputed here (rare) rather than held in registers.
          int row_begin = 0;
          if (Tile::kVariants && p.variants.window > 0) {
            const int gr = row0 + mt * 16 + half * 8 + lane / 4;
            row_begin = decode_first_key(p, seqlen_k, gr < rows_total ? gr / p.group : p.q_len - 1);
          }
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int key = warp_key0 + nt * 8 + 2 * (lane % 4) + c;
              if (key >= row_end[mt][half] || key < row_begin) s[mt][nt][2 * half + c] = -INFINITY;
            }
        }
    }
    softmax.update(s, o, scale_log2);
    if constexpr (Tile::kRegisterFp8) decode_accumulate_pv_fp8<T, Tile>(o, s, v_rows, lane);
    else accumulate_pv<T, typename Tile::WarpTile>(o, s, sV, lane);
  }

  // Merge the warps' partial rows: each warp's max, sum and unnormalized O through shared
  // memory (over the ring, now idle), then one pass over the rows.
  ptx::launch_dependents();  // the merge kernel may start launching
  ptx::cp_async_wait<0>();
  __syncthreads();
  float* s_o = reinterpret_cast<float*>(ring);
#pragma unroll
  for (int mt = 0; mt < Tile::kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 16 + half * 8 + lane / 4;
      float sum = softmax.row_sum[mt][half];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (lane % 4 == 0) {
        s_max[warp][r] = softmax.row_max[mt][half];
        s_sum[warp][r] = sum;
      }
      if constexpr (Tile::kRegisterFp8) {  // O's columns in decode_fp8_o_column's order
        float* row = s_o + (warp * kRows + r) * Tile::kMergePitch;
        const int n = 2 * (lane % 4);
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          row[decode_fp8_o_column<D>(dt, n)] = o[mt][dt][2 * half];
          row[decode_fp8_o_column<D>(dt, n + 1)] = o[mt][dt][2 * half + 1];
        }
      } else {
        float* dst = s_o + (warp * kRows + r) * Tile::kMergePitch + 2 * (lane % 4);
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt)
          *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[mt][dt][2 * half], o[mt][dt][2 * half + 1]);
      }
    }
  __syncthreads();

  const float v_scale = Tile::kFp8 ? p.v.scale[kv_head] : 1.0f;
  for (int item = tid; item < kRows * D / 4; item += Tile::kThreads) {
    const int r = item / (D / 4), c = (item % (D / 4)) * 4, gr = row0 + r;
    if (gr >= rows_total) break;  // items run row-major: every later item is past the rows too
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < Tile::kWarps; ++w) m = fmaxf(m, s_max[w][r]);
    float l = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < Tile::kWarps; ++w) {
      if (s_max[w][r] == -INFINITY) continue;  // no key of this warp reached the row
      const float weight = ptx::exp2_approx((s_max[w][r] - m) * scale_log2);
      l += s_sum[w][r] * weight;
      const float4 ow = *reinterpret_cast<const float4*>(s_o + (w * kRows + r) * Tile::kMergePitch + c);
      acc.x += weight * ow.x;
      acc.y += weight * ow.y;
      acc.z += weight * ow.z;
      acc.w += weight * ow.w;
    }
    const int token = gr / p.group, head = kv_head * p.group + gr % p.group;
    float inv = l > 0.0f ? v_scale / l : 0.0f;
    float lse = l > 0.0f ? (m * scale_log2 + log2f(l)) * 0.6931471805599453f : -INFINITY;
    if (Tile::kVariants && p.variants.sinks != nullptr && p.splits == 1) {  // the sink joins the denominator once (else at the merge)
      const float sink = p.variants.sinks[head] * 1.4426950408889634f, m2 = l > 0.0f ? m * scale_log2 : -INFINITY;
      const float top = fmaxf(m2, sink), keep = l > 0.0f ? ptx::exp2_approx(m2 - top) : 0.0f;
      const float total = l * keep + ptx::exp2_approx(sink - top);
      inv = v_scale * keep / total;
      lse = (top + log2f(total)) * 0.6931471805599453f;
    }
    if (p.splits == 1) {
      T* dst = static_cast<T*>(p.out.data) + b * p.out.batch_stride + token * p.out.row_stride +
               head * p.out.head_stride + c;
      *reinterpret_cast<uint2*>(dst) = make_uint2(ptx::pack2<T>(acc.x * inv, acc.y * inv),
                                                  ptx::pack2<T>(acc.z * inv, acc.w * inv));
      if (c == 0 && p.lse) p.lse[(static_cast<int64_t>(b) * p.heads_q + head) * p.q_len + token] = lse;
    } else if (p.cluster_merge) {  // into warp 0's rows (this thread alone read these 4 floats)
      *reinterpret_cast<float4*>(s_o + r * Tile::kMergePitch + c) =
          make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
      if (c == 0) s_lse[r] = lse;
    } else {
      const int64_t row = ((static_cast<int64_t>(split) * p.batch + b) * p.q_len + token) * p.heads_q + head;
      *reinterpret_cast<float4*>(p.partial_out + row * D + c) =
          make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
      if (c == 0) p.partial_lse[row] = lse;
    }
  }
  if (p.cluster_merge) decode_cluster_merge<T, Tile>(p, s_o, s_lse, b, kv_head, row0, rows_total);
}

// Merges the splits' partial rows: out = sum_s exp(lse_s - lse) O_s with lse the
// log-sum-exp of the lse_s (splits that saw no key have lse -inf, O 0, and weigh nothing).
// One warp per (sequence, token, query head) row: the lanes read the splits' lse values
// together (split s in lane s % 32), then every split's O row is read with independent
// loads (unrolled, so several are in flight: the loop is latency-bound otherwise), each
// lane D / 32 columns. grid ceil(rows / 4), 128 threads; splits <= 32 * kMaxSplitWords.
// Launched as a programmatic dependent of the main kernel, so its launch overlaps that
// kernel's tail.
constexpr int kMaxSplitWords = 4;

template <class T, int kHeadDim, bool kVariants>
__global__ void __launch_bounds__(128) attention_decode_merge_kernel(const __grid_constant__ DecodeParams p) {
  constexpr int kCols = kHeadDim / 32, kBatch = 8;
  __shared__ float s_weight[4][32 * kMaxSplitWords];
  ptx::wait_for_prior_grid();  // launched early (programmatic dependent launch)
  const int64_t rows = static_cast<int64_t>(p.batch) * p.q_len * p.heads_q;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  if (row >= rows) return;
  float lse[kMaxSplitWords];
  float m = -INFINITY;
#pragma unroll
  for (int w = 0; w < kMaxSplitWords; ++w) {
    const int s = lane + 32 * w;
    lse[w] = s < p.splits ? p.partial_lse[s * rows + row] : -INFINITY;
    m = fmaxf(m, lse[w]);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  // An attention sink joins the merged denominator once (natural log units, as the lse).
  const float sink = kVariants && p.variants.sinks ? p.variants.sinks[row % p.heads_q] : -INFINITY;
  if (kVariants) m = fmaxf(m, sink);
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kMaxSplitWords; ++w) {
    const float weight = lse[w] == -INFINITY ? 0.0f : ptx::exp2_approx((lse[w] - m) * 1.4426950408889634f);
    s_weight[warp][lane + 32 * w] = weight;
    sum += weight;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (kVariants && sink != -INFINITY) sum += ptx::exp2_approx((sink - m) * 1.4426950408889634f);
  __syncwarp();
  float acc[kCols] = {};
  const float* o = p.partial_out + row * kHeadDim + lane;
  const int64_t split_stride = rows * kHeadDim;
  for (int s0 = 0; s0 < p.splits; s0 += kBatch) {
    float v[kBatch][kCols];  // kBatch splits' loads issued before any is used
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
#pragma unroll
      for (int c = 0; c < kCols; ++c) v[i][c] = s0 + i < p.splits ? o[(s0 + i) * split_stride + 32 * c] : 0.0f;
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const float weight = s0 + i < p.splits ? s_weight[warp][s0 + i] : 0.0f;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[c] += weight * v[i][c];
    }
  }
  const int head = static_cast<int>(row % p.heads_q);
  const int token = static_cast<int>((row / p.heads_q) % p.q_len);
  const int b = static_cast<int>(row / (static_cast<int64_t>(p.heads_q) * p.q_len));
  T* out = static_cast<T*>(p.out.data) + b * p.out.batch_stride + token * p.out.row_stride + head * p.out.head_stride;
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
  for (int c = 0; c < kCols; ++c) out[lane + 32 * c] = from_float<T>(acc[c] * inv);
  if (lane == 0 && p.lse)
    p.lse[(static_cast<int64_t>(b) * p.heads_q + head) * p.q_len + token] = sum > 0.0f ? m + logf(sum) : -INFINITY;
}

}  // namespace llmk::detail
