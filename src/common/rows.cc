#include "common/rows.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace llmk::detail {

std::string dims_string(const int64_t* dims, int ndim) {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

void check_element_aligned(const char* op, const char* arg, const TensorView& t) {
  const auto address = reinterpret_cast<uintptr_t>(t.data());
  LLMK_CHECK(address % static_cast<uintptr_t>(dtype_size(t.dtype())) == 0, op, ": ", arg,
             " data pointer ", t.data(), " is not aligned to its ", dtype_size(t.dtype()),
             "-byte ", dtype_name(t.dtype()), " elements");
}

Rows as_rows(const char* op, const char* arg, const TensorView& t) {
  LLMK_CHECK(t.ndim() >= 1, op, ": ", arg, " must have at least 1 dimension, got a scalar");
  Rows r;
  r.d = t.size(-1);
  r.rows = 1;
  for (int i = 0; i < t.ndim() - 1; ++i) r.rows *= t.size(i);
  LLMK_CHECK(r.d <= 1 || t.stride(-1) == 1, op, ": ", arg,
             " must be contiguous in its last dim, got stride ", t.stride(-1));
  if (r.rows * r.d != 0) check_element_aligned(op, arg, t);
  // Leading dims must collapse into one row stride: walking them from the innermost out,
  // each stride is the next-inner stride times that dim's size (dims of size 1 are free).
  int64_t expected = -1;
  for (int i = t.ndim() - 2; i >= 0; --i) {
    if (t.size(i) == 1) continue;
    if (expected < 0) {
      r.row_stride = t.stride(i);
    } else {
      LLMK_CHECK(t.stride(i) == expected, op, ": ", arg,
                 " leading dims do not flatten into uniformly strided rows (dim ", i,
                 " has stride ", t.stride(i), ", expected ", expected, ")");
    }
    expected = t.stride(i) * t.size(i);
  }
  if (expected < 0) r.row_stride = r.d;  // a single row
  LLMK_CHECK(r.rows <= 1 || r.row_stride >= r.d, op, ": ", arg, " rows overlap (row stride ",
             r.row_stride, " < row length ", r.d, ")");
  r.data = t.data();
  return r;
}

void check_vector(const char* op, const char* arg, const TensorView& t, int64_t n) {
  LLMK_CHECK(t.ndim() == 1 && t.size(0) == n, op, ": ", arg, " must have shape [", n, "], got ",
             shape_string(t));
  LLMK_CHECK(n <= 1 || t.stride(0) == 1, op, ": ", arg, " must be contiguous, got stride ",
             t.stride(0));
  if (n > 0) check_element_aligned(op, arg, t);
}

void check_dtype(const char* op, const char* arg, const TensorView& t, DType expected) {
  LLMK_CHECK(t.dtype() == expected, op, ": ", arg, " has dtype ", dtype_name(t.dtype()),
             ", expected ", dtype_name(expected));
}

void check_same_shape(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                      const TensorView& ref) {
  bool same = t.ndim() == ref.ndim();
  for (int i = 0; same && i < t.ndim(); ++i) same = t.size(i) == ref.size(i);
  if (same) return;
  throw_error(op, ": ", arg, " has shape ", shape_string(t), " but ", ref_arg, " has shape ",
              shape_string(ref));
}

void check_same_device(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                       const TensorView& ref) {
  LLMK_CHECK(t.device() == ref.device(), op, ": ", arg, " is on ",
             device_type_name(t.device().type), ":", t.device().index, " but ", ref_arg,
             " is on ", device_type_name(ref.device().type), ":", ref.device().index);
}

Rows check_like(const char* op, const char* arg, const TensorView& t, const char* ref_arg,
                const TensorView& ref) {
  check_same_device(op, arg, t, ref_arg, ref);
  check_dtype(op, arg, t, ref.dtype());
  check_same_shape(op, arg, t, ref_arg, ref);
  return as_rows(op, arg, t);
}

void check_float_dtype(const char* op, const char* arg, const TensorView& t) {
  LLMK_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f16 || t.dtype() == DType::bf16,
             op, ": ", arg, " has unsupported dtype ", dtype_name(t.dtype()),
             " (expected float32, float16 or bfloat16)");
}

bool rows_vectorizable(std::initializer_list<Rows> rows, DType dtype) {
  const int64_t elem = dtype_size(dtype), n = 16 / elem;
  for (const Rows& r : rows) {
    if (r.data == nullptr) continue;
    if (!is_aligned(r.data, 16) || r.d % n != 0) return false;
    if (r.rows > 1 && (r.row_stride * elem) % 16 != 0) return false;
  }
  return true;
}

void check_workspace(const char* op, const std::optional<TensorView>& workspace, const TensorView& ref,
                     int64_t needed, const char* size_fn, DType dtype) {
  LLMK_CHECK(workspace.has_value(), op, ": CUDA tensors need a ", dtype_name(dtype), " workspace of ", needed,
             " elements (", size_fn, ")");
  check_same_device(op, "workspace", *workspace, "x", ref);
  check_dtype(op, "workspace", *workspace, dtype);
  LLMK_CHECK(workspace->ndim() == 1 && workspace->numel() >= needed, op, ": workspace must be a 1-d ",
             dtype_name(dtype), " tensor of at least ", needed, " elements, got shape ", shape_string(*workspace));
  LLMK_CHECK(workspace->numel() <= 1 || workspace->stride(0) == 1, op,
             ": workspace must be contiguous, got stride ", workspace->stride(0));
  LLMK_CHECK(is_aligned(workspace->data(), 16), op, ": workspace data pointer ", workspace->data(),
             " is not 16-byte aligned");
}

bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data() != b.data() || a.ndim() != b.ndim() || a.dtype() != b.dtype()) return false;
  for (int i = 0; i < a.ndim(); ++i)
    if (a.size(i) != b.size(i) || (a.size(i) > 1 && a.stride(i) != b.stride(i))) return false;
  return true;
}

ByteSpan byte_span(const TensorView& t) {
  int64_t extent = 1;
  for (int i = 0; i < t.ndim(); ++i) extent += (t.size(i) - 1) * t.stride(i);
  const auto first = reinterpret_cast<uintptr_t>(t.data());
  return {first, first + static_cast<uintptr_t>(extent * dtype_size(t.dtype()))};
}

bool is_contiguous(const TensorView& t) {
  int64_t expected = 1;
  for (int i = t.ndim() - 1; i >= 0; --i) {
    if (t.size(i) != 1 && t.stride(i) != expected) return false;
    expected *= t.size(i);
  }
  return true;
}

void check_no_overlap(const char* op, const char* a_arg, const TensorView& a, const char* b_arg,
                      const TensorView& b, bool allow_identical) {
  if (a.numel() == 0 || b.numel() == 0) return;
  if (a.device() != b.device()) return;
  if (same_view(a, b)) {
    LLMK_CHECK(allow_identical, op, ": ", a_arg, " and ", b_arg,
               " are the same tensor, which this op does not allow");
    return;
  }
  const ByteSpan sa = byte_span(a), sb = byte_span(b);
  LLMK_CHECK(sa.last <= sb.first || sb.last <= sa.first, op, ": ", a_arg, " and ", b_arg,
             " overlap in memory; they must be ",
             allow_identical ? "the same tensor or disjoint" : "disjoint");
}

// No two elements of `t` share an address: with the dims sorted by stride, each stride
// covers the extent of the dims inside it (the [batch, heads, seq, dim] transpose passes).
void check_no_self_overlap(const char* op, const char* arg, const TensorView& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims of size > 1
  for (int i = 0; i < t.ndim(); ++i) {
    LLMK_CHECK(t.stride(i) >= 0, op, ": ", arg, " has a negative stride in dim ", i);
    if (t.size(i) > 1) dims.emplace_back(t.stride(i), t.size(i));
  }
  std::sort(dims.begin(), dims.end());
  int64_t extent = 1;
  for (const auto& [stride, size] : dims) {
    LLMK_CHECK(stride >= extent, op, ": ", arg,
               " has elements that share memory (a stride of ", stride, " inside an extent of ",
               extent, "); it is written in place");
    extent = stride * size;
  }
}

}  // namespace llmk::detail
