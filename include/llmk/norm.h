// Normalization: rmsnorm, add_rmsnorm / add_rmsnorm_ (fused residual add), rmsnorm_backward,
// rmsnorm_swiglu (gated RMSNorm) and its backward, layernorm and layernorm_backward.
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

// Fused residual add + RMSNorm, out of place and in place:
//   add_rmsnorm:   residual_out = x + residual      (rounded to the dtype)
//                  out          = rmsnorm(residual_out)
//                  out may be x and residual_out may be residual; any other overlap of the
//                  four tensors is rejected.
//   add_rmsnorm_:  the in-place form (vLLM's fused_add_rms_norm): residual += x, then
//                  x = rmsnorm(residual); add_rmsnorm with out = x, residual_out = residual.
void add_rmsnorm(const TensorView& out, const TensorView& residual_out, const TensorView& x,
                 const TensorView& residual, const TensorView& weight, double eps,
                 double offset = 0.0, cudaStream_t stream = nullptr);
void add_rmsnorm_(const TensorView& x, const TensorView& residual, const TensorView& weight,
                  double eps, double offset = 0.0, cudaStream_t stream = nullptr);

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

// Elements of f32 workspace rmsnorm_backward (and rmsnorm_swiglu_backward) needs for x
// with `rows` rows of `d` elements on CUDA device `device_index` (0 on the CPU path).
int64_t rmsnorm_backward_workspace_size(int64_t rows, int64_t d, int device_index = 0);

// Fused RMSNorm + SwiGLU gate (the gated RMSNorm of Mamba-2 with norm_before_gate and of
// Gated DeltaNet / Qwen3-Next's FusedRMSNormGated):
//   out = rmsnorm(x) * (offset + weight) * silu(gate) = swiglu(gate, rmsnorm(x))
// in one pass: the normalized tensor never goes to memory (3 tensors of traffic instead of
// rmsnorm + swiglu's 5). gate: x's shape and dtype. rstd as rmsnorm's. out may be x or
// gate itself (in place); any other overlap is rejected.
void rmsnorm_swiglu(const TensorView& out, const TensorView& x, const TensorView& gate,
                    const TensorView& weight, double eps, double offset = 0.0,
                    const std::optional<TensorView>& rstd = std::nullopt,
                    cudaStream_t stream = nullptr);

// Backward of rmsnorm_swiglu, with y = rmsnorm(x) * (offset + weight) recomputed from x:
//   dgate = dy * y * silu'(gate);  dx, dweight = rmsnorm_backward of dy * silu(gate)
// in one pass over dy, x and gate. dx and dgate overlap no other tensor.
// workspace: rmsnorm_backward_workspace_size elements, as rmsnorm_backward's.
void rmsnorm_swiglu_backward(const TensorView& dx, const TensorView& dgate,
                             const TensorView& dweight, const TensorView& dy,
                             const TensorView& x, const TensorView& gate,
                             const TensorView& weight, double eps, double offset = 0.0,
                             const std::optional<TensorView>& workspace = std::nullopt,
                             cudaStream_t stream = nullptr);

// out, x: [..., d] of f32/f16/bf16. weight, bias (each optional: absent means 1 and 0):
// [d], x's dtype or f32, the same dtype when both are given. mean, rstd (optional): [rows]
// f32, receive each row's mean and rsqrt(variance + eps). out may be x itself.
void layernorm(const TensorView& out, const TensorView& x, const std::optional<TensorView>& weight,
               const std::optional<TensorView>& bias, double eps,
               const std::optional<TensorView>& mean = std::nullopt,
               const std::optional<TensorView>& rstd = std::nullopt, cudaStream_t stream = nullptr);

// Backward of layernorm, with xhat = (x - mean) * rstd and g = dy * weight:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   dweight = sum over rows of dy * xhat,  dbias = sum over rows of dy
// mean and rstd: recomputed from x (and eps), or, when both are given, the forward's
// ([rows] f32, as layernorm writes them for this x): one reduction per row fewer, and the
// gradient of exactly the normalization the forward applied. dweight (needs weight) and
// dbias are optional, in the weight's (bias's) dtype, reduced deterministically through
// `workspace` (f32, layernorm_backward_workspace_size elements; ignored on the CPU).
void layernorm_backward(const TensorView& dx, const std::optional<TensorView>& dweight,
                        const std::optional<TensorView>& dbias, const TensorView& dy,
                        const TensorView& x, const std::optional<TensorView>& weight, double eps,
                        const std::optional<TensorView>& mean = std::nullopt,
                        const std::optional<TensorView>& rstd = std::nullopt,
                        const std::optional<TensorView>& workspace = std::nullopt,
                        cudaStream_t stream = nullptr);

int64_t layernorm_backward_workspace_size(int64_t rows, int64_t d, int device_index = 0);

}  // namespace llmk
