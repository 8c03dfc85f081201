// Kernel parameter blocks of the softmax family, shared by the launchers, the kernels and
// the CPU references. Rows are [rows, n] with their own row strides.
#pragma once

#include <cstdint>

namespace llmk::detail {

struct SoftmaxParams {
  void* out;
  const void* x;
  int64_t rows;
  int64_t n;
  int64_t out_stride;
  int64_t x_stride;
  float scale;
  float sign;         // of scale: +1 or -1
  float scale_log2e;  // scale * log2(e), rounded once
};

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
