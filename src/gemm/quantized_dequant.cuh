// Dequantization of llmk's packed int4 / int8 codes (the layout of
// include/llmk/quantized_gemm.h) into pairs of T, the mma A fragments of the streaming
// kernel (gemm_small_m_kernel.cuh) and of the Hopper kernel (quantized_sm90_kernel.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/device_types.cuh"

namespace llmk::detail::dequant {

// Dequantization of llmk's packed codes (the layout of include/llmk/quantized_gemm.h) into
// mma fragments: four pairs of T (the elements 2p, 2p + 1 of this lane's 8 consecutive k) as
// ((q - z) exactly) * s, one rounding, which is what dequantize_weight writes. `zz`: the pair
// (kMagic + z, kMagic + z); `ss`: (s, s).
template <class T>
struct QuantPair;
template <>
struct QuantPair<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  static constexpr uint32_t kMagic = 0x43004300u;  // bf16 128 + q for q < 16 (7 mantissa bits)
  static constexpr float kMagicValue = 128.0f;
};
template <>
struct QuantPair<__half> {
  using T2 = __half2;
  static constexpr uint32_t kMagic = 0x64006400u;  // f16 1024 + q for q < 1024
  static constexpr float kMagicValue = 1024.0f;
};

template <class T>
__device__ __forceinline__ uint32_t sub_mul_pair(uint32_t v, uint32_t zz, uint32_t ss) {
  using T2 = typename QuantPair<T>::T2;
  const T2 r = __hmul2(__hsub2(*reinterpret_cast<const T2*>(&v), *reinterpret_cast<const T2*>(&zz)),
                       *reinterpret_cast<const T2*>(&ss));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// The zero operand: the pair (magic + z) in T, or for int8 codes with bf16 the float 2^23 + z
// (bits); per load and row with zero points, once for the symmetric z = 2^(bits-1).
template <class T, int kBits>
__device__ __forceinline__ uint32_t zero_operand(uint32_t z) {
  if constexpr (kBits == 8 && std::is_same_v<T, __nv_bfloat16>) {
    return __float_as_uint(8388608.0f + static_cast<float>(z));
  } else if constexpr (kBits == 4) {
    // magic + z by integer addition (exact: z < 16 is far below magic's unit mantissa range),
    // doubled into both halves.
    return ((QuantPair<T>::kMagic & 0xFFFFu) + z) * 0x10001u;
  } else {
    const T zt = from_float<T>((kBits == 8 ? 1024.0f : QuantPair<T>::kMagicValue) + static_cast<float>(z));
    const uint32_t zu = *reinterpret_cast<const unsigned short*>(&zt);
    return zu | (zu << 16);
  }
}

// int4: word = codes e = 0..7 at nibbles p(2j) = j, p(2j + 1) = j + 4.
template <class T>
__device__ __forceinline__ void dequant_int4(uint32_t word, uint32_t zz, uint32_t ss, uint32_t (&d)[4]) {
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    uint32_t v;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(v) : "r"(word >> (4 * p)), "n"(0x000F000F), "n"(QuantPair<T>::kMagic));
    d[p] = sub_mul_pair<T>(v, zz, ss);
  }
}

// int4 with the scale applied after the mma (kFold): the pairs (magic + q) as they are for
// bf16 (its zero point comes off through the sum of x, see the kernel), (q - z) exactly for
// f16 (whose magic 1024 would cost the fp32 sum ten bits: its 8 magic/ulp ratio is 1024).
template <class T>
__device__ __forceinline__ void dequant_int4_unscaled(uint32_t word, uint32_t zz, uint32_t (&d)[4]) {
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    uint32_t v;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(v) : "r"(word >> (4 * p)), "n"(0x000F000F), "n"(QuantPair<T>::kMagic));
    if constexpr (std::is_same_v<T, __half>) {
      const __half2 r = __hsub2(*reinterpret_cast<const __half2*>(&v), *reinterpret_cast<const __half2*>(&zz));
      v = *reinterpret_cast<const uint32_t*>(&r);
    }
    d[p] = v;
  }
}

// int8: two words of codes e = 0..3 in bytes e. f16 takes 1024 + q directly (PRMT);
// bf16 (7 mantissa bits) goes through float 2^23 + q, exact, then one conversion.
template <class T>
__device__ __forceinline__ void dequant_int8(uint32_t w0, uint32_t w1, uint32_t zz, uint32_t ss, uint32_t (&d)[4]) {
  const float zf = __uint_as_float(zz);
  const uint32_t w[2] = {w0, w1};
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      if constexpr (std::is_same_v<T, __half>) {
        const uint32_t v = __byte_perm(w[h], 0x64u, q == 0 ? 0x4140u : 0x4342u);
        d[2 * h + q] = sub_mul_pair<T>(v, zz, ss);
      } else {
        const float lo = __uint_as_float(__byte_perm(w[h], 0x4B000000u, 0x7440u + 2 * q)) - zf;
        const float hi = __uint_as_float(__byte_perm(w[h], 0x4B000000u, 0x7441u + 2 * q)) - zf;
        const __nv_bfloat162 v2 = __floats2bfloat162_rn(lo, hi);
        const __nv_bfloat162 r = __hmul2(v2, *reinterpret_cast<const __nv_bfloat162*>(&ss));
        d[2 * h + q] = *reinterpret_cast<const uint32_t*>(&r);
      }
    }
}

}  // namespace llmk::detail::dequant
