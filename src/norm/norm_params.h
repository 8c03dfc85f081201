// Kernel parameter blocks of the normalization family (RMSNorm and LayerNorm), shared by
// the launchers, the kernels and the CPU references.
#pragma once

#include <cstdint>

namespace llmk::detail {

// Forward: s = x (+ residual); y = (s - mean) * rstd * (offset + weight) + bias, where
// mean = 0 for RMSNorm and rstd = rsqrt(mean((s - mean)^2) + eps); rmsnorm_swiglu
// multiplies y by silu(gate).
struct NormParams {
  void* out;                 // [rows, d]
  void* residual_out;        // [rows, d], add_rmsnorm only
  const void* x;             // [rows, d]
  const void* residual;      // [rows, d], add_rmsnorm only
  const void* weight;        // [d]; nullptr (LayerNorm without affine weight): 1
  const void* bias;          // [d]; nullptr: 0 (always nullptr for RMSNorm)
  float* mean;               // [rows], optional (LayerNorm)
  float* rstd;               // [rows], optional
  int64_t rows;
  int64_t d;
  int64_t out_stride;
  int64_t residual_out_stride;
  int64_t x_stride;
  int64_t residual_stride;
  float eps;
  float offset;
  const void* gate;          // [rows, d], rmsnorm_swiglu only: out *= silu(gate)
  int64_t gate_stride;
};

// Backward, with xhat = (x - mean) * rstd and g = dy * (offset + weight):
//   dx = rstd * (g - [LayerNorm: mean(g)] - xhat * mean(g * xhat))  (+ dresidual)
//   dweight = sum over rows of dy * xhat;  dbias = sum over rows of dy
struct NormBackwardParams {
  void* dx;                  // [rows, d]
  void* dweight;             // [d], weight's dtype; nullptr: not wanted
  void* dbias;               // [d], LayerNorm only; nullptr: not wanted
  const void* dy;            // [rows, d]
  const void* x;             // [rows, d]
  const void* weight;        // [d]; nullptr: 1
  const void* dresidual;     // [rows, d], optional: added to dx
  // rmsnorm_swiglu only (out = y * silu(gate), y the RMSNorm output): dy is the gradient of
  // out, the norm sees dy * silu(gate), and dgate = dy * y * silu'(gate).
  void* dgate;               // [rows, d]
  const void* gate;          // [rows, d]
  // LayerNorm only, both or neither: the forward's per-row mean and rstd ([rows]), read
  // instead of recomputed from x.
  const float* saved_mean;
  const float* saved_rstd;
  float* partial;            // workspace: partial dweight [blocks, d], partial dbias [blocks, d]
                             // (LayerNorm), then per-row mean and rstd for the loop path
  int64_t rows;
  int64_t d;
  int64_t dx_stride;
  int64_t dy_stride;
  int64_t x_stride;
  int64_t dresidual_stride;
  int64_t dgate_stride;
  int64_t gate_stride;
  int64_t blocks;            // rows are split among this many partial sums
  float eps;
  float offset;
};

}  // namespace llmk::detail
