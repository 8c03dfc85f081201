// The softmax forward's kernel parameter block (softmax family: src/softmax/softmax_params.h
// includes it). It lives in common because RowScale (common/softmax_rows.cuh), which
// cross_entropy shares, is constructed from it. Rows are [rows, n] with their own row strides.
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

}  // namespace llmk::detail
