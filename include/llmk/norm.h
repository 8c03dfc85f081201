// Normalization: rmsnorm, add_rmsnorm (fused residual add), rmsnorm_backward, layernorm
// and layernorm_backward.
//
// Tensors are [..., d] with a contiguous last dim; the leading dims are flattened into
// rows that may be strided (row stride >= d). Math is fp32 on the GPU and double on the
// CPU; outputs are rounded once. Each function runs on the GPU when its tensors are CUDA
// tensors (on `stream`) and on the CPU reference when they are host tensors.
//
//   rmsnorm:   y = x * rsqrt(mean(x^2) + eps) * (offset + weight)
//              offset = 0 for Llama/Qwen/Mistral, 1 for Gemma's (1 + weight).
//   layernorm: y = (x - mean(x)) * rsqrt(mean((x - mean(x))^2) + eps) * weight + bias
#pragma once

#include <cstdint>
#include <optional>

#include <cuda_runtime_api.h>

#include "llmk/tensor.h"

namespace llmk {

// out, x: [..., d] of f32/f16/bf16; weight: [d] of x's dtype or f32.
// rstd (optional): [rows] f32, receives rsqrt(mean(x^2) + eps) per row.
// out may be x itself (in place); any other overlap is rejected.
void rmsnorm(const TensorView& out, const TensorView& x, const TensorView& weight, double eps,
             double offset = 0.0, const std::optional<TensorView>& rstd = std::nullopt,
             cudaStream_t stream = nullptr);

// Fused residual add + RMSNorm:
//   residual_out = x + residual          (rounded to the dtype)
//   out          = rmsnorm(residual_out)
// In place (vLLM's fused_add_rms_norm): pass out = x and residual_out = residual.
// Out of place: four distinct tensors. Any other overlap is rejected.
void add_rmsnorm(const TensorView& out, const TensorView& residual_out, const TensorView& x,
                 const TensorView& residual, const TensorView& weight, double eps,
                 double offset = 0.0, cudaStream_t stream = nullptr);

// Backward of rmsnorm: given dy and the forward's x, weight, eps, offset,
//   dx      = r * w' * dy - x * r^3 / d * sum(dy * w' * x)  (+ dresidual, if given)
//   dweight = sum over rows of dy * x * r,   with r = rsqrt(mean(x^2) + eps), w' = offset + w.
// r is recomputed from x (no extra memory traffic). dweight is reduced deterministically
// through `workspace`, a CUDA f32 buffer of rmsnorm_backward_workspace_size() elements
// (ignored on the CPU). dresidual (optional) is added to dx: the gradient that flows into
// the residual stream of add_rmsnorm.
void rmsnorm_backward(const TensorView& dx, const TensorView& dweight, const TensorView& dy,
                      const TensorView& x, const TensorView& weight, double eps,
                      double offset = 0.0,
                      const std::optional<TensorView>& dresidual = std::nullopt,
                      const std::optional<TensorView>& workspace = std::nullopt,
                      cudaStream_t stream = nullptr);

// Elements of f32 workspace rmsnorm_backward needs for x with `rows` rows of `d` elements
// on CUDA device `device_index` (0 on the CPU path).
int64_t rmsnorm_backward_workspace_size(int64_t rows, int64_t d, int device_index = 0);

// out, x: [..., d] of f32/f16/bf16. weight, bias (each optional: absent means 1 and 0):
// [d], x's dtype or f32, the same dtype when both are given. mean, rstd (optional): [rows]
// f32, receive each row's mean and rsqrt(variance + eps). out may be x itself.
void layernorm(const TensorView& out, const TensorView& x, const std::optional<TensorView>& weight,
               const std::optional<TensorView>& bias, double eps,
               const std::optional<TensorView>& mean = std::nullopt,
               const std::optional<TensorView>& rstd = std::nullopt, cudaStream_t stream = nullptr);

// Backward of layernorm, with xhat = (x - mean) * rstd recomputed from x and g = dy * weight:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   dweight = sum over rows of dy * xhat,  dbias = sum over rows of dy
// dweight (needs weight) and dbias are optional, in the weight's (bias's) dtype, reduced
// deterministically through `workspace` (f32, layernorm_backward_workspace_size elements;
// ignored on the CPU).
void layernorm_backward(const TensorView& dx, const std::optional<TensorView>& dweight,
                        const std::optional<TensorView>& dbias, const TensorView& dy,
                        const TensorView& x, const std::optional<TensorView>& weight, double eps,
                        const std::optional<TensorView>& workspace = std::nullopt,
                        cudaStream_t stream = nullptr);

int64_t layernorm_backward_workspace_size(int64_t rows, int64_t d, int device_index = 0);

}  // namespace llmk
