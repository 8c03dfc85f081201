// Host-side element types for the CPU reference: f16 and bf16 stored as bits, converted
// to and from float with round-to-nearest-even. No CUDA headers needed.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/dispatch.h"

namespace llmk::detail {

struct HostHalf { uint16_t bits; };
struct HostBFloat16 { uint16_t bits; };

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

template <class Tag> struct HostType;
template <> struct HostType<DTypeTag<DType::f32>> { using type = float; };
template <> struct HostType<DTypeTag<DType::f16>> { using type = HostHalf; };
template <> struct HostType<DTypeTag<DType::bf16>> { using type = HostBFloat16; };
template <class Tag> using host_type_t = typename HostType<Tag>::type;

}  // namespace llmk::detail
