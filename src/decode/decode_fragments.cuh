// The decode kernel's per-warp tensor-core steps that differ from the forward's: Q's
// fragments held in registers for a block's pass, and for an fp8 cache the scores Q K^T and
// O += P V with K and V converted in registers straight into the mma fragments (fp16 mma,
// a permuted head-dim order shared by Q and K; see decode_scores_fp8).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/ptx.cuh"
#include "decode/decode_tile.cuh"
#include "decode/decode_values.cuh"

namespace llmk::detail {

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

}  // namespace llmk::detail
