// The normalization family's argument checks, shared by its API (norm_api.cc) and the ops that
// end in a norm (distributed/all_reduce_api.cc).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/dispatch.h"
#include "common/rows.h"
#include "llmk/error.h"
#include "llmk/tensor.h"

namespace llmk::detail {

inline void check_eps(const char* op, double eps) {
  LLMK_CHECK(std::isfinite(eps) && eps > 0.0, op, ": eps must be a finite number > 0, got ", eps);
}

inline void check_offset(const char* op, double offset) {
  LLMK_CHECK(std::isfinite(offset), op, ": offset must be finite, got ", offset);
}

// A per-column parameter (weight, bias): [d], x's dtype or f32, on x's device.
inline void check_column_param(const char* op, const char* arg, const TensorView& t, const TensorView& x,
                               int64_t d) {
  check_same_device(op, arg, t, "x", x);
  check_vector(op, arg, t, d);
  LLMK_CHECK(t.dtype() == x.dtype() || t.dtype() == DType::f32, op, ": ", arg, " has dtype ",
             dtype_name(t.dtype()), ", expected ", act_or_f32(x.dtype(), "x's"));
}

}  // namespace llmk::detail
