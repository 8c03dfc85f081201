// Softmax and log-softmax over the last dim, forward and backward.
//
//   softmax(x)_i     = exp(s x_i - m) / sum_j exp(s x_j - m),   m = max_j s x_j
//   log_softmax(x)_i = s x_i - m - log(sum_j exp(s x_j - m))
// with an optional scale s (attention's 1/sqrt(d), a temperature's 1/T; any value of
// magnitude below 2.3e38, negative included). fp32 math with the exponents formed as
// (x - the row's extreme x) * s, so fp32 keeps full accuracy at large |s x|; one rounding
// per output; f32, f16 and bf16, every tensor of a call in one dtype. Rows of any length from 1 column up: rows that fit in registers
// are read from memory once, longer rows take a two-pass online path (a running max and
// rescaled sum on the first pass, the outputs on the second).
//
// Masking: entries whose scaled value s x is -inf get probability 0. A row that is
// entirely -inf (a fully masked row) gives softmax zeros (not NaN, unlike torch.softmax)
// and log_softmax -inf. NaN or +inf in s x makes that row NaN, as in PyTorch (so a
// negative scale turns -inf inputs into +inf: mask after scaling, or mask with +inf).
//
// Backward, from the forward's output y and dy = dL/dy:
//   softmax:     dx = s * y * (dy - sum_j dy_j y_j)
//   log_softmax: dx = s * (dy - exp(y) * sum_j dy_j)
#pragma once

#include <cuda_runtime_api.h>

#include "llmk/tensor.h"

namespace llmk {

// out, x: [..., n]. out may be x itself (in place); any other overlap is rejected.
void softmax(const TensorView& out, const TensorView& x, double scale = 1.0,
             cudaStream_t stream = nullptr);
void log_softmax(const TensorView& out, const TensorView& x, double scale = 1.0,
                 cudaStream_t stream = nullptr);

// dx, dy, y: [..., n]; y is the forward's output. dx may be dy or y itself.
void softmax_backward(const TensorView& dx, const TensorView& dy, const TensorView& y,
                      double scale = 1.0, cudaStream_t stream = nullptr);
void log_softmax_backward(const TensorView& dx, const TensorView& dy, const TensorView& y,
                          double scale = 1.0, cudaStream_t stream = nullptr);

}  // namespace llmk
