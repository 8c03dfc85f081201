// Kernel parameter blocks of the RMSNorm family, shared by the launchers and the kernels.
#pragma once

#include <cstdint>

namespace llmk::detail {

struct RMSNormParams {
  void* out;                 // [rows, d]
  void* residual_out;        // [rows, d], add_rmsnorm only
  const void* x;             // [rows, d]
  const void* residual;      // [rows, d], add_rmsnorm only
  const void* weight;        // [d]
  float* rstd;               // [rows], optional
  int64_t rows;
  int64_t d;
  int64_t out_stride;
  int64_t residual_out_stride;
  int64_t x_stride;
  int64_t residual_stride;
  float eps;
  float offset;
};

struct RMSNormBackwardParams {
  void* dx;                  // [rows, d]
  void* dweight;             // [d], weight's dtype
  const void* dy;            // [rows, d]
  const void* x;             // [rows, d]
  const void* weight;        // [d]
  const void* dresidual;     // [rows, d], optional: added to dx
  float* partial;            // workspace: [blocks, d] partial dweight sums, then [rows] rstd
  int64_t rows;
  int64_t d;
  int64_t dx_stride;
  int64_t dy_stride;
  int64_t x_stride;
  int64_t dresidual_stride;
  int64_t blocks;            // rows are split among this many partial sums
  float eps;
  float offset;
};

}  // namespace llmk::detail
