// Kernel parameter blocks of the softmax family, shared by the launchers, the kernels and
// the CPU references. Rows are [rows, n] with their own row strides. The forward's
// (SoftmaxParams) is in common/softmax_params.h, beside RowScale, which is built from it.
#pragma once

#include <cstdint>

#include "common/softmax_params.h"

namespace llmk::detail {

struct SoftmaxBackwardParams {
  void* dx;
  const void* dy;
  const void* y;  // the forward's output (softmax or log_softmax)
  int64_t rows;
  int64_t n;
  int64_t dx_stride;
  int64_t dy_stride;
  int64_t y_stride;
  float scale;
};

}  // namespace llmk::detail
