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

// Columns col .. col + 3 of row `row` from their fp32 sums (a split's reduced pieces): act(acc
// + bias) + residual, stored in out's type; columns from p.n on are skipped. residual may
// alias out: each element is read, then written, by the calling thread.
template <class TOut, GemmActivation Act>
__device__ __forceinline__ void gemm_store_four(const GemmParams& p, int64_t row, int64_t col,
                                                const float (&acc)[4]) {
  TOut* out = static_cast<TOut*>(p.out) + row * p.ld_out;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (col + e >= p.n) break;
    float v = gemm_activate<Act>(acc[e] + gemm_bias_at<TOut>(p, col + e));
    v += gemm_residual_at<TOut>(p, row, col + e);
    out[col + e] = from_float<TOut>(v);
  }
}

}  // namespace llmk::detail
