// Per-element helpers of the decode kernel: RoPE of a head vector's pair, a value rounded
// (or quantized to e4m3) for the cache, and e4m3 cache bytes as fp16 / bf16 values.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "common/device_types.cuh"
#include "common/fp8_e4m3.cuh"
#include "common/ptx.cuh"
#include "decode/attention_decode_params.h"
#include "decode/decode_tile.cuh"

namespace llmk::detail {

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

}  // namespace llmk::detail
