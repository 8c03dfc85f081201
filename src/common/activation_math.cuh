// The pointwise activations of the library in fp32 device math: value and derivative of
// silu, gelu (erf) and gelu (tanh form). Used by the gated activations, bias_gelu and the
// gated RMSNorm.
#pragma once

#include "common/activation_math.h"
#include "common/device_types.cuh"

namespace llmk::detail {

// act(g) and, for the backward, act'(g) in fp32.
template <Activation A>
struct ActivationMath;

template <>
struct ActivationMath<Activation::silu> {
  static __device__ __forceinline__ float value(float g) { return g / (1.0f + __expf(-g)); }
  static __device__ __forceinline__ void value_and_slope(float g, float& v, float& slope) {
    const float s = 1.0f / (1.0f + __expf(-g));  // sigmoid; exp overflow gives s = 0, fine
    v = g * s;
    slope = s * (1.0f + g * (1.0f - s));
  }
};

// GELU through erfc and the tanh form through a sigmoid: 1 + erf(z) = erfc(-z) and
// 1 + tanh(z) = 2 sigmoid(2z) stay accurate for large negative g, where 1 + erf(z) and
// 1 + tanh(z) cancel to a few bits.
template <>
struct ActivationMath<Activation::gelu> {
  static __device__ __forceinline__ float value(float g) {
    return 0.5f * g * erfcf(-g * 0.70710678118654752f);
  }
  static __device__ __forceinline__ void value_and_slope(float g, float& v, float& slope) {
    const float cdf = 0.5f * erfcf(-g * 0.70710678118654752f);
    const float pdf = 0.39894228040143268f * __expf(-0.5f * g * g);
    v = g * cdf;
    slope = cdf + g * pdf;
  }
};

template <>
struct ActivationMath<Activation::gelu_tanh> {
  static constexpr float kAlpha = 0.79788456080286536f;  // sqrt(2 / pi)
  static constexpr float kBeta = 0.044715f;
  // sigmoid(2 z), z = alpha (g + beta g^3): the tanh form's 0.5 (1 + tanh(z)). The
  // reciprocal is __fdividef's (within 2 ulp, as __expf's own error; 0 for denominators over
  // 2^126, where the sigmoid is below 1e-38 and g s rounds to 0 or a denormal): the IEEE
  // division's Newton steps and slow-path branch per element made the bias_gelu backward
  // issue-bound.
  static __device__ __forceinline__ float half_one_plus_tanh(float g) {
    return __fdividef(1.0f, 1.0f + __expf(-2.0f * kAlpha * (g + kBeta * g * g * g)));
  }
  static __device__ __forceinline__ float value(float g) { return g * half_one_plus_tanh(g); }
  static __device__ __forceinline__ void value_and_slope(float g, float& v, float& slope) {
    const float s = half_one_plus_tanh(g);
    v = g * s;
    // d/dg [g s] = s + g * 2 s (1 - s) * alpha (1 + 3 beta g^2), since 1 - tanh^2 = 4 s (1 - s).
    slope = s + 2.0f * g * s * (1.0f - s) * kAlpha * (1.0f + 3.0f * kBeta * g * g);
  }
};

}  // namespace llmk::detail
