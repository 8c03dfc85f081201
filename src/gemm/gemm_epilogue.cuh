// The epilogue every gemm kernel applies to its fp32 accumulators, in one place so that
// the Hopper, small-M and mma.sync kernels agree bit for bit on the math:
//   v = acc + bias[col]; v = act(v) (silu_mul: silu(gate) * up); v += residual[row, col].
#pragma once

#include "common/activation_math.cuh"
#include "common/device_types.cuh"
#include "gemm/gemm.h"

namespace llmk::detail {

// act(acc + bias) for the one-input activations.
template <GemmActivation Act>
__device__ __forceinline__ float gemm_activate(float v) {
  if constexpr (Act == GemmActivation::gelu) return ActivationMath<Activation::gelu>::value(v);
  else if constexpr (Act == GemmActivation::gelu_tanh) return ActivationMath<Activation::gelu_tanh>::value(v);
  else return v;
}

// silu(gate) * up, gate and up already biased.
__device__ __forceinline__ float gemm_silu_mul(float gate, float up) {
  return ActivationMath<Activation::silu>::value(gate) * up;
}

// Loads bias[col] (0 when absent) and residual[row, col] (0 when absent) in fp32.
template <class TOut>
__device__ __forceinline__ float gemm_bias_at(const GemmParams& p, int64_t col) {
  return p.bias ? to_float(static_cast<const TOut*>(p.bias)[col]) : 0.0f;
}
template <class TOut>
__device__ __forceinline__ float gemm_residual_at(const GemmParams& p, int64_t row, int64_t col) {
  return p.residual ? to_float(static_cast<const TOut*>(p.residual)[row * p.ld_residual + col]) : 0.0f;
}

}  // namespace llmk::detail
