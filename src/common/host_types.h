// Host-side element types for the CPU reference: f16, bf16 and float8 e4m3 stored as bits,
// converted to and from float with round-to-nearest-even. No CUDA headers needed.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/dispatch.h"

namespace llmk::detail {

struct HostHalf { uint16_t bits; };
struct HostBFloat16 { uint16_t bits; };
// float8 e4m3 "fn" (OCP FP8): sign, 4 exponent bits (bias 7), 3 mantissa bits; no
// infinities, S.1111.111 is NaN, the largest finite value 448.
struct HostF8E4M3 { uint8_t bits; };

inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float to_float(float v) { return v; }
inline float to_float(HostBFloat16 v) { return bits_float(uint32_t(v.bits) << 16); }
inline float to_float(HostHalf v) {
  uint32_t sign = uint32_t(v.bits & 0x8000) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1f;
  uint32_t mant = v.bits & 0x3ff;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    float f = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -f : f;
  }
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

// Exact: every e4m3 value is a float.
inline float to_float(HostF8E4M3 v) {
  const uint32_t sign = uint32_t(v.bits & 0x80) << 24;
  const uint32_t exp = (v.bits >> 3) & 0xf;
  const uint32_t mant = v.bits & 0x7;
  if (exp == 0xf && mant == 0x7) return bits_float(sign | 0x7fc00000u);  // nan
  if (exp == 0) {  // zero or subnormal: mant * 2^-9
    const float f = static_cast<float>(mant) * (1.0f / 512.0f);
    return sign ? -f : f;
  }
  return bits_float(sign | ((exp + 120) << 23) | (mant << 20));
}

template <class T> T from_float(float f);
template <> inline float from_float<float>(float f) { return f; }
template <> inline HostBFloat16 from_float<HostBFloat16>(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};  // quiet nan
  u += 0x7fffu + ((u >> 16) & 1u);
  return {uint16_t(u >> 16)};
}
template <> inline HostHalf from_float<HostHalf>(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return {uint16_t(sign | 0x7e00)};     // nan
  if (absu >= 0x477ff000u) return {uint16_t(sign | 0x7c00)};    // rounds to inf
  if (absu < 0x38800000u) {                                     // subnormal or zero
    // value * 2^24 rounded to nearest even, exact in float arithmetic
    float scaled = bits_float(absu) * 16777216.0f;
    uint32_t m = static_cast<uint32_t>(scaled);
    float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return {uint16_t(sign | m)};
  }
  uint32_t rounded = absu + 0xfffu + ((absu >> 13) & 1u);
  return {uint16_t(sign | ((rounded - 0x38000000u) >> 13))};
}

// Round to nearest even with saturation (PTX cvt.rn.satfinite.e4m3x2.f32): magnitudes
// beyond 448, infinities included, become +-448; NaN stays NaN.
template <> inline HostF8E4M3 from_float<HostF8E4M3>(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80);
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return {uint8_t(sign | 0x7f)};  // nan
  if (absu >= 0x43e00000u) return {uint8_t(sign | 0x7e)};  // >= 448 (inf too): 448
  if (absu < 0x3c800000u) {                                // below 2^-6: subnormal or zero
    // value * 2^9 rounded to nearest even, exact in float arithmetic; 8 is the smallest normal
    const float scaled = bits_float(absu) * 512.0f;
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return {uint8_t(sign | m)};
  }
  // Keep 3 of the 23 mantissa bits, rounding half to even; a carry moves into the exponent.
  const uint32_t rounded = absu + 0x7ffffu + ((absu >> 20) & 1u);
  const uint32_t code = (rounded - (120u << 23)) >> 20;  // exponent rebiased from 127 to 7
  return {uint8_t(sign | code)};  // at most 0x7e: everything from 448 on returned above
}

template <class Tag> struct HostType;
template <> struct HostType<DTypeTag<DType::f32>> { using type = float; };
template <> struct HostType<DTypeTag<DType::f16>> { using type = HostHalf; };
template <> struct HostType<DTypeTag<DType::bf16>> { using type = HostBFloat16; };
template <class Tag> using host_type_t = typename HostType<Tag>::type;

}  // namespace llmk::detail
