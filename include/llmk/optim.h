// Fused optimizer steps.
//
// adamw_step_: one AdamW update (Loshchilov & Hutter, as torch.optim.AdamW) of a list of
// parameter tensors in as few launches as the list needs (one per 256 tensors of a dtype),
// each element read and written once:
//   p <- p * (1 - lr * weight_decay)
//   m <- beta1 * m + (1 - beta1) * g          v <- beta2 * v + (1 - beta2) * g^2
//   p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// with g = -grad when `maximize`. Parameters are f32, f16 or bf16 (each tensor its own
// dtype), grads have the parameter's dtype and shape, the moments m (exp_avg) and v
// (exp_avg_sq) are f32; math is fp32 on the GPU, double on the host, one rounding per
// stored value. The step count t is read from a f32 scalar tensor per parameter (the caller
// increments it before the call, as torch's capturable optimizers do) and lr optionally
// from a f32 scalar tensor, so a captured CUDA graph replays with the current values.
// Every tensor is contiguous and on one device; GPU tensors run on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <optional>
#include <vector>

#include "llmk/tensor.h"

namespace llmk {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool maximize = false;
};

struct AdamWParam {
  TensorView param;       // updated in place
  TensorView grad;        // param's dtype and shape
  TensorView exp_avg;     // f32, param's shape; updated in place
  TensorView exp_avg_sq;  // f32, param's shape; updated in place
  TensorView step;        // f32, one element: the step count t >= 1 of this update
};

// Updates every param, exp_avg and exp_avg_sq in place. lr_tensor (optional): a f32
// one-element tensor whose value replaces options.lr.
void adamw_step_(const std::vector<AdamWParam>& params, const AdamWOptions& options,
                 const std::optional<TensorView>& lr_tensor = std::nullopt,
                 cudaStream_t stream = nullptr);

}  // namespace llmk
