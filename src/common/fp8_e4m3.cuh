// fp8 e4m3 (OCP "E4M3FN": 1 sign, 4 exponent bits of bias 7, 3 mantissa bits, no
// infinities, NaN = S.1111.111) to fp16, two values at a time and exactly: every e4m3 value
// is an fp16 value.
//
// sm_89 and later convert a pair in one instruction (cvt.rn.f16x2.e4m3x2). Older GPUs
// (sm_80) take e4m3x2_to_half2_bits: each byte's sign, exponent and mantissa moved into the
// fp16 fields (a byte shift and two masks), which reads the value scaled by 2^(7 - 15);
// one fp16 multiply by 2^8 restores it, subnormals included (e4m3's smallest, 2^-9, is an
// fp16 normal; its fp16-field reading, 2^-17, an fp16 subnormal, which fp16 arithmetic
// keeps); the NaN pattern gets fp16's all-ones exponent. cuda_fp8.h's emulation of the
// same conversion on sm_80 is several times the code (it doubled the sm_80 compile of the
// decode kernels).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace llmk::detail {

// The e4m3 bytes 0 and 1 of `pair` as the bits of a half2 (byte 0 in the low half).
__device__ __forceinline__ uint32_t e4m3x2_to_half2_bits(uint32_t pair) {
  const uint32_t u = __byte_perm(pair, 0u, 0x1404u);  // byte i at bits 16 i + 8 .. 16 i + 15
  const uint32_t magnitude = u & 0x7f007f00u;
  uint32_t h = (u & 0x80008000u) | (magnitude >> 1);
  h |= __vcmpeq2(magnitude, 0x7f007f00u) & 0x7c007c00u;  // S.1111.111: NaN
  const __half2 scaled = __hmul2(*reinterpret_cast<const __half2*>(&h), __half2(__half(256.0f), __half(256.0f)));
  return *reinterpret_cast<const uint32_t*>(&scaled);
}

__device__ __forceinline__ __half2 e4m3x2_to_half2(uint32_t pair) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3));
#else
  const uint32_t bits = e4m3x2_to_half2_bits(pair);
  return *reinterpret_cast<const __half2*>(&bits);
#endif
}

}  // namespace llmk::detail
