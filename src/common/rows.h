// Validation helpers shared by the row-wise ops: a tensor [..., d] seen as `rows` rows of
// `d` contiguous elements spaced `row_stride` elements apart.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "llmk/tensor.h"

namespace llmk::detail {

struct Rows {
  void* data = nullptr;
  int64_t rows = 0;
  int64_t d = 0;
  int64_t row_stride = 0;
};

// A list of dims as error messages print shapes: "[2, 64]" ("[]" for none).
std::string dims_string(const int64_t* dims, int ndim);
inline std::string shape_string(const TensorView& t) { return dims_string(t.shape(), t.ndim()); }

// Checks that `t` has at least one dim, a contiguous last dim, an element-aligned data
// pointer and leading dims that flatten into uniformly strided rows.
Rows as_rows(const char* op, const char* arg, const TensorView& t);

// Checks that the data pointer of `t` is aligned to its elements.
void check_element_aligned(const char* op, const char* arg, const TensorView& t);

// Checks that `t` is a contiguous 1-d tensor of n elements.
void check_vector(const char* op, const char* arg, const TensorView& t, int64_t n);

void check_dtype(const char* op, const char* arg, const TensorView& t, DType expected);
void check_same_shape(const char* op, const char* arg, const TensorView& t,
                      const char* ref_arg, const TensorView& ref);
void check_same_device(const char* op, const char* arg, const TensorView& t,
                       const char* ref_arg, const TensorView& ref);

// Rejects partial overlap of the memory spans of two tensors. Identical views (same
// pointer, shape and strides) are allowed only when `allow_identical` is true.
void check_no_overlap(const char* op, const char* a_arg, const TensorView& a,
                      const char* b_arg, const TensorView& b, bool allow_identical);

bool same_view(const TensorView& a, const TensorView& b);

// Rejects a tensor written in place whose elements share memory (a stride of 0 or strides
// that interleave); non-negative strides only. Transposed views pass.
void check_no_self_overlap(const char* op, const char* arg, const TensorView& t);

// [first, last) bytes touched by a tensor with non-negative strides.
struct ByteSpan {
  uintptr_t first, last;
};
ByteSpan byte_span(const TensorView& t);

// Row-major dense (dims of size 1 may have any stride).
bool is_contiguous(const TensorView& t);

// Checks that `t` matches `ref` in device, dtype and shape; returns t's rows.
Rows check_like(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                const TensorView& ref);

// Checks that `t` holds f32, f16 or bf16 (the dtypes of every llmk activation tensor).
void check_float_dtype(const char* op, const char* arg, const TensorView& t);

// Every row set (data == nullptr: absent, skipped) starts 16-byte aligned, has a row
// stride of whole 16-byte vectors and d a multiple of the vector of `dtype`: the
// condition of the 16-byte vector kernels.
bool rows_vectorizable(std::initializer_list<Rows> rows, DType dtype);

// The CUDA workspace of a call: on ref's device, of `dtype` (f32: the backwards' accumulators),
// 1-d, contiguous, 16-byte aligned, at least `needed` elements (`size_fn` names the function
// that gives `needed`).
void check_workspace(const char* op, const std::optional<TensorView>& workspace, const TensorView& ref,
                     int64_t needed, const char* size_fn, DType dtype = DType::f32);

inline bool is_aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

}  // namespace llmk::detail
