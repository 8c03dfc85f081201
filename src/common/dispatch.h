// dispatch_dtype: turns a run-time floating-point DType into a compile-time tag so that
// one generic lambda serves every element type. The tag is std::integral_constant<DType, ...>; the
// caller maps it to a type with host_type_t (CPU code) or device_type_t (CUDA code).
#pragma once

#include <string>
#include <type_traits>

#include "llmk/dtype.h"
#include "llmk/error.h"

namespace llmk::detail {

template <DType D>
using DTypeTag = std::integral_constant<DType, D>;

template <class F>
decltype(auto) dispatch_dtype(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32: return f(DTypeTag<DType::f32>{});
    case DType::f16: return f(DTypeTag<DType::f16>{});
    case DType::bf16: return f(DTypeTag<DType::bf16>{});
    case DType::i32:
    case DType::i64:
    case DType::f8e4m3:
    case DType::u8: break;
  }
  throw_error(op, ": unsupported dtype ", dtype_name(dtype));
}

// What a weight may be beside activations of dtype `act`, for an error message: "float32"
// when act is float32, else e.g. "bfloat16 (x's) or float32" (`whose`: "x's").
inline std::string act_or_f32(DType act, const char* whose) {
  if (act == DType::f32) return "float32";
  return std::string(dtype_name(act)) + " (" + whose + ") or float32";
}

// Dispatch on the dtype of the activations and of the weight, where the weight is
// either the activations' dtype or f32 (fp32 master weights under mixed precision).
template <class F>
decltype(auto) dispatch_act_weight(DType act, DType weight, const char* op, F&& f) {
  return dispatch_dtype(act, op, [&](auto act_tag) {
    if (weight == act) return f(act_tag, act_tag);
    LLMK_CHECK(weight == DType::f32, op, ": weight dtype ", dtype_name(weight), " must be ",
               act_or_f32(act, "the input's"));
    return f(act_tag, DTypeTag<DType::f32>{});
  });
}

}  // namespace llmk::detail
