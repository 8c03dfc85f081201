// Public entry points of the gemm family: validate every argument (a rejected call writes
// nothing), pick a layout for each operand, then run the CPU reference or one of the CUDA
// paths (Hopper TMA + wgmma, small-M split-K, mma.sync), chosen per call or forced through
// the environment variable LLMK_GEMM_PATH (auto | sm90 | small_m | sm80). rmsnorm_linear: the
// small-M kernel with the norm fused, or from kGemmSm90FromM rows on Hopper (automatic path
// only) llmk::rmsnorm into scratch memory and the Hopper GEMM.
#include <algorithm>
#include <cmath>
#include <string>

#include "common/cuda_check.h"
#include "common/dispatch.h"
#include "common/env_path.h"
#include "common/rows.h"
#include "common/scratch.h"
#include "gemm/gemm.h"
#include "llmk/gemm.h"
#include "llmk/norm.h"

namespace llmk {

using detail::Rows;

namespace {

constexpr const char* kGemm = "gemm";
constexpr const char* kRmsnormLinear = "rmsnorm_linear";

std::string strides_string(const TensorView& t) { return detail::dims_string(t.strides(), t.ndim()); }

// The 16-byte rule of both ops: the data pointer of a non-empty operand is 16-byte
// aligned and its non-contiguous stride is a whole number of 16-byte vectors, unless the
// dimension that stride steps over has size 1.
void check_aligned_16(const char* op, const char* arg, const void* data, int64_t numel, int64_t stride,
                      int64_t stepped_size, const char* stepped_name, DType dtype) {
  if (numel == 0) return;
  LLMK_CHECK(detail::is_aligned(data, 16), op, ": ", arg, " data pointer ", data,
             " is not 16-byte aligned (the rows and data pointers of the matrix operands must be "
             "16-byte aligned)");
  const int64_t bytes = stride * dtype_size(dtype);
  LLMK_CHECK(stepped_size <= 1 || bytes % 16 == 0, op, ": ", arg, " has a stride of ", stride,
             " elements (", bytes, " bytes) over its ", stepped_name, " dimension of size ", stepped_size,
             ", which is not a multiple of 16 bytes (the rows of the matrix operands must be 16-byte "
             "aligned: pad them to a multiple of ",
             16 / dtype_size(dtype), " ", dtype_name(dtype), " elements)");
}

// A matrix operand as the kernels see it: element (r, k) at data[r * ld + k] when
// k_major, else at data[k * ld + r]; r runs over `outer` (M for a, N for b).
struct Operand {
  const void* data = nullptr;
  int64_t ld = 0;
  bool k_major = true;
  int64_t outer = 0;
};

bool stride_aligned(int64_t stride, int64_t stepped_size, DType dtype) {
  return stepped_size <= 1 || (stride * dtype_size(dtype)) % 16 == 0;
}

// A 2-d view [outer, k] read either K-contiguous (stride(1) == 1) or outer-contiguous
// (stride(0) == 1). When both strides qualify (a dim of size 1), the K-contiguous reading
// is taken unless its stride breaks the 16-byte rule and the other's does not.
Operand operand_2d(const char* op, const char* arg, const TensorView& t, const char* outer_name,
                   const char* major_name) {
  const int64_t outer = t.size(0), k = t.size(1);
  const bool k_ok = k <= 1 || t.stride(1) == 1;
  const bool outer_ok = outer <= 1 || t.stride(0) == 1;
  LLMK_CHECK(k_ok || outer_ok, op, ": ", arg, " of shape ", detail::shape_string(t), " and strides ",
             strides_string(t), " must be contiguous in K (stride(1) == 1) or in ", outer_name,
             " (stride(0) == 1)");
  Operand o;
  o.data = t.data();
  o.outer = outer;
  o.k_major = k_ok && (!outer_ok || stride_aligned(t.stride(0), outer, t.dtype()) ||
                       !stride_aligned(t.stride(1), k, t.dtype()));
  if (o.k_major) {
    o.ld = outer <= 1 ? std::max<int64_t>(k, 1) : t.stride(0);
    LLMK_CHECK(outer <= 1 || k <= 1 || o.ld >= k, op, ": ", arg, " rows overlap (", outer_name,
               " stride ", o.ld, " < K = ", k, ")");
    LLMK_CHECK(outer <= 1 || o.ld >= 0, op, ": ", arg, " has a negative stride ", o.ld);
  } else {
    o.ld = k <= 1 ? std::max<int64_t>(outer, 1) : t.stride(1);
    LLMK_CHECK(k <= 1 || outer <= 1 || o.ld >= outer, op, ": ", arg, " (", major_name,
               ") columns overlap (K stride ", o.ld, " < ", outer_name, " = ", outer, ")");
    LLMK_CHECK(k <= 1 || o.ld >= 0, op, ": ", arg, " has a negative stride ", o.ld);
  }
  if (t.numel() > 0) detail::check_element_aligned(op, arg, t);
  return o;
}

enum class Path { automatic, sm90, small_m, sm80 };

// LLMK_GEMM_PATH, read on every call so that tests and benchmarks can switch paths (errors
// name `op`).
Path requested_path(const char* op = kGemm) {
  return static_cast<Path>(detail::env_path(op, "LLMK_GEMM_PATH", {"auto", "sm90", "small_m", "sm80"}));
}

std::string describe(const detail::GemmParams& p) {
  return detail::concat("m ", p.m, ", n ", p.n, ", k ", p.k, ", a ", p.a_k_major ? "K" : "M", "-major, b ",
                        p.b_k_major ? "K" : "N", "-major, lda ", p.lda, ", ldb ", p.ldb, ", ", dtype_name(p.in_dtype),
                        " -> ", dtype_name(p.out_dtype));
}

void gemm_cuda(const detail::GemmParams& p, int device, cudaStream_t stream) {
  const Path path = requested_path();
  // K == 0 (out = act(bias) + residual) is the mma.sync kernel's alone.
  const bool k_ok = p.k > 0;
  switch (path) {
    case Path::automatic:
      if (k_ok && p.m >= detail::kGemmSm90FromM && detail::gemm_sm90_takes(p, device))
        return detail::gemm_sm90_cuda(p, stream);
      if (k_ok && detail::gemm_small_m_takes(p)) return detail::gemm_small_m_cuda(p, stream);
      return detail::gemm_sm80_cuda(p, stream);
    case Path::sm90:
      LLMK_CHECK(k_ok && detail::gemm_sm90_takes(p, device), kGemm,
                 ": LLMK_GEMM_PATH=sm90 cannot take this call (", describe(p), ", device ", device,
                 "; it needs an sm_90 device, an sm_90a build, 16-byte aligned rows and k > 0)");
      return detail::gemm_sm90_cuda(p, stream);
    case Path::small_m:
      LLMK_CHECK(k_ok && detail::gemm_small_m_takes(p), kGemm, ": LLMK_GEMM_PATH=small_m cannot take this call (",
                 describe(p), "; it needs m <= ", detail::kGemmSmallM, ", a K-major b, 16-byte aligned rows and k > 0)");
      return detail::gemm_small_m_cuda(p, stream);
    case Path::sm80:
      return detail::gemm_sm80_cuda(p, stream);
  }
}

// rmsnorm_linear from M = kGemmSm90FromM on the automatic path, where the Hopper kernel takes
// the product: llmk::rmsnorm into scratch memory (the rows rounded to x's dtype, as the fused
// kernel's are), then the GEMM, in chunks of kRmsnormLinearChunkRows rows (the scratch stays
// <= 2048 x K). The fused small-M kernel streams the weight once per 64-row chunk on mma.sync
// and ran 0.35-0.5x of the unfused pair at M = 33-64 (H200). False, with nothing done, when
// this does not apply.
constexpr int64_t kRmsnormLinearChunkRows = 2048;

bool rmsnorm_then_gemm(const detail::RmsnormLinearParams& p, const Device& device, cudaStream_t stream) {
  if (p.m < detail::kGemmSm90FromM || requested_path(kRmsnormLinear) != Path::automatic ||
      !detail::scratch_available(device.index))
    return false;
  // a: the scratch rows, k elements apart (k is a multiple of 8 wherever the Hopper kernel
  // takes b, so they are 16-byte aligned); a null pointer passes the alignment check.
  const detail::GemmParams whole =
      detail::plain_gemm_params(p.out, p.ld_out, nullptr, p.k, p.w, p.ldw, p.m, p.n, p.k, p.in_dtype);
  if (!detail::gemm_sm90_takes(whole, device.index)) return false;
  const int64_t chunk = std::min(p.m, kRmsnormLinearChunkRows), es = dtype_size(p.in_dtype);
  void* normed = detail::scratch_alloc(static_cast<size_t>(chunk * p.k * es), device.index, stream);
  try {
    const int64_t weight_shape[1] = {p.k}, weight_strides[1] = {1};
    const TensorView weight(const_cast<void*>(p.g), p.g_dtype, device, 1, weight_shape, weight_strides);
    for (int64_t r0 = 0; r0 < p.m; r0 += chunk) {
      const int64_t rows = std::min(chunk, p.m - r0);
      const int64_t shape[2] = {rows, p.k}, x_strides[2] = {p.ldx, 1}, n_strides[2] = {p.k, 1};
      const TensorView x(const_cast<char*>(static_cast<const char*>(p.x)) + r0 * p.ldx * es, p.in_dtype, device, 2,
                         shape, x_strides);
      rmsnorm(TensorView(normed, p.in_dtype, device, 2, shape, n_strides), x, weight, p.eps, 0.0, std::nullopt,
              stream);
      detail::GemmParams g = whole;
      g.a = normed;
      g.out = static_cast<char*>(p.out) + r0 * p.ld_out * es;
      g.m = rows;
      detail::gemm_sm90_cuda(g, stream);
    }
  } catch (...) {
    detail::scratch_free(normed, stream);
    throw;
  }
  detail::scratch_free(normed, stream);
  return true;
}

}  // namespace

void gemm(const TensorView& out, const TensorView& a, const TensorView& b, const GemmEpilogue& epilogue,
          cudaStream_t stream) {
  const char* op = kGemm;
  // dtypes
  LLMK_CHECK(a.dtype() == DType::f16 || a.dtype() == DType::bf16, op, ": a has dtype ", dtype_name(a.dtype()),
             ", expected float16 or bfloat16");
  LLMK_CHECK(b.dtype() == a.dtype(), op, ": b has dtype ", dtype_name(b.dtype()), " but a has dtype ",
             dtype_name(a.dtype()), " (they must be the same)");
  detail::check_float_dtype(op, "out", out);
  const DType out_dtype = out.dtype();
  if (epilogue.bias) detail::check_dtype(op, "bias", *epilogue.bias, out_dtype);
  if (epilogue.residual) detail::check_dtype(op, "residual", *epilogue.residual, out_dtype);
  // devices
  detail::check_same_device(op, "b", b, "a", a);
  detail::check_same_device(op, "out", out, "a", a);
  if (epilogue.bias) detail::check_same_device(op, "bias", *epilogue.bias, "a", a);
  if (epilogue.residual) detail::check_same_device(op, "residual", *epilogue.residual, "a", a);

  // a: [..., K] with K-contiguous rows, or a 2-d M-contiguous view.
  LLMK_CHECK(a.ndim() >= 1, op, ": a must have at least 1 dimension, got a scalar");
  Operand A;
  int64_t k = 0;
  if (a.ndim() == 2) {
    A = operand_2d(op, "a", a, "M", "M-major");
    k = a.size(1);
  } else {
    LLMK_CHECK(a.size(-1) <= 1 || a.stride(-1) == 1, op, ": a of shape ", detail::shape_string(a), " and strides ",
               strides_string(a), " must be contiguous in its last (K) dim (only a 2-d a may be M-contiguous)");
    const Rows r = detail::as_rows(op, "a", a);
    A.data = r.data;
    A.ld = r.rows <= 1 ? std::max<int64_t>(r.d, 1) : r.row_stride;
    A.k_major = true;
    A.outer = r.rows;
    k = r.d;
  }
  const int64_t m = A.outer;
  // b: [N, K], K-contiguous or N-contiguous.
  LLMK_CHECK(b.ndim() == 2, op, ": b must be 2-d [N, K], got shape ", detail::shape_string(b));
  LLMK_CHECK(b.size(1) == k, op, ": b has shape ", detail::shape_string(b), " but a has K = ", k,
             " (b must be [N, ", k, "])");
  const Operand B = operand_2d(op, "b", b, "N", "N-major");
  const int64_t n = B.outer;
  const bool silu_mul = epilogue.activation == GemmActivation::silu_mul;
  LLMK_CHECK(epilogue.activation == GemmActivation::none || silu_mul ||
                 epilogue.activation == GemmActivation::gelu || epilogue.activation == GemmActivation::gelu_tanh,
             op, ": unknown activation ", static_cast<int>(epilogue.activation));
  LLMK_CHECK(!silu_mul || n % 2 == 0, op, ": silu_mul needs an even N (gate rows then up rows of b), got N = ", n);
  const int64_t n_out = silu_mul ? n / 2 : n;

  // out: [..., N_out] with a's leading dims.
  LLMK_CHECK(out.ndim() == a.ndim(), op, ": out has shape ", detail::shape_string(out), " but a has shape ",
             detail::shape_string(a), " (out must be [", A.k_major || a.ndim() != 2 ? "..." : "M", ", ", n_out, "])");
  bool shape_ok = out.size(-1) == n_out;
  for (int i = 0; i + 1 < a.ndim(); ++i) shape_ok = shape_ok && out.size(i) == a.size(i);
  LLMK_CHECK(shape_ok, op, ": out has shape ", detail::shape_string(out), ", expected a's leading dims of ",
             detail::shape_string(a), " and a last dim of ", n_out, silu_mul ? " (N / 2 for silu_mul)" : "");
  const Rows o = detail::as_rows(op, "out", out);

  if (epilogue.bias) detail::check_vector(op, "bias", *epilogue.bias, n);
  Rows res{};
  if (epilogue.residual) {
    detail::check_same_shape(op, "residual", *epilogue.residual, "out", out);
    res = detail::as_rows(op, "residual", *epilogue.residual);
  }

  // 16-byte rows of a and b.
  const DType in_dtype = a.dtype();
  check_aligned_16(op, "a", A.data, m * k, A.ld, A.k_major ? m : k, A.k_major ? "M" : "K", in_dtype);
  check_aligned_16(op, "b", B.data, n * k, B.ld, B.k_major ? n : k, B.k_major ? "N" : "K", in_dtype);

  // out is written: it must not share memory with what is read, except residual == out.
  detail::check_no_overlap(op, "out", out, "a", a, false);
  detail::check_no_overlap(op, "out", out, "b", b, false);
  if (epilogue.bias) detail::check_no_overlap(op, "out", out, "bias", *epilogue.bias, false);
  if (epilogue.residual) detail::check_no_overlap(op, "out", out, "residual", *epilogue.residual, true);

  if (m == 0 || n_out == 0) return;

  detail::GemmParams p{};
  p.out = o.data;
  p.ld_out = o.rows <= 1 ? n_out : o.row_stride;
  p.a = A.data;
  p.lda = A.ld;
  p.a_k_major = A.k_major;
  p.b = B.data;
  p.ldb = B.ld;
  p.b_k_major = B.k_major;
  p.bias = epilogue.bias ? epilogue.bias->data() : nullptr;
  p.residual = epilogue.residual ? res.data : nullptr;
  p.ld_residual = epilogue.residual ? (res.rows <= 1 ? n_out : res.row_stride) : 0;
  if (epilogue.residual && detail::same_view(out, *epilogue.residual)) p.ld_residual = p.ld_out;
  p.m = m;
  p.n = n;
  p.k = k;
  p.activation = epilogue.activation;
  p.in_dtype = in_dtype;
  p.out_dtype = out_dtype;

  if (!a.is_cuda()) return detail::gemm_cpu(p);
  detail::DeviceGuard guard(op, "a", a);
  gemm_cuda(p, a.device().index, stream);
}

void rmsnorm_linear(const TensorView& out, const TensorView& x, const TensorView& norm_weight,
                    const TensorView& weight, double eps, cudaStream_t stream) {
  const char* op = kRmsnormLinear;
  LLMK_CHECK(x.dtype() == DType::f16 || x.dtype() == DType::bf16, op, ": x has dtype ", dtype_name(x.dtype()),
             ", expected float16 or bfloat16");
  LLMK_CHECK(norm_weight.dtype() == x.dtype() || norm_weight.dtype() == DType::f32, op, ": norm_weight has dtype ",
             dtype_name(norm_weight.dtype()), ", expected ", detail::act_or_f32(x.dtype(), "x's"));
  LLMK_CHECK(weight.dtype() == x.dtype(), op, ": weight has dtype ", dtype_name(weight.dtype()), ", expected ",
             dtype_name(x.dtype()), " (x's)");
  LLMK_CHECK(out.dtype() == x.dtype(), op, ": out has dtype ", dtype_name(out.dtype()), ", expected ",
             dtype_name(x.dtype()), " (x's)");
  detail::check_same_device(op, "norm_weight", norm_weight, "x", x);
  detail::check_same_device(op, "weight", weight, "x", x);
  detail::check_same_device(op, "out", out, "x", x);

  const Rows xr = detail::as_rows(op, "x", x);
  const int64_t m = xr.rows, k = xr.d;
  detail::check_vector(op, "norm_weight", norm_weight, k);
  LLMK_CHECK(weight.ndim() == 2 && weight.size(1) == k, op, ": weight must be 2-d [N, ", k,
             "] (K from x's last dim), got shape ", detail::shape_string(weight));
  const Rows wr = detail::as_rows(op, "weight", weight);
  const int64_t n = wr.rows;
  bool shape_ok = out.ndim() == x.ndim() && out.size(-1) == n;
  for (int i = 0; shape_ok && i + 1 < x.ndim(); ++i) shape_ok = out.size(i) == x.size(i);
  LLMK_CHECK(shape_ok, op, ": out has shape ", detail::shape_string(out), ", expected x's leading dims of ",
             detail::shape_string(x), " and a last dim of ", n, " (weight's N)");
  const Rows orow = detail::as_rows(op, "out", out);
  LLMK_CHECK(std::isfinite(eps) && eps >= 0.0, op, ": eps must be a finite number >= 0, got ", eps);

  const DType dt = x.dtype();
  const int64_t x_ld = m <= 1 ? std::max<int64_t>(k, 1) : xr.row_stride;
  const int64_t w_ld = n <= 1 ? std::max<int64_t>(k, 1) : wr.row_stride;
  check_aligned_16(op, "x", xr.data, m * k, x_ld, m, "row", dt);
  check_aligned_16(op, "weight", wr.data, n * k, w_ld, n, "N", dt);
  LLMK_CHECK(k == 0 || detail::is_aligned(norm_weight.data(), 16), op, ": norm_weight data pointer ",
             norm_weight.data(), " is not 16-byte aligned");

  detail::check_no_overlap(op, "out", out, "x", x, false);
  detail::check_no_overlap(op, "out", out, "norm_weight", norm_weight, false);
  detail::check_no_overlap(op, "out", out, "weight", weight, false);

  if (m == 0 || n == 0) return;
  detail::RmsnormLinearParams p{};
  p.out = orow.data;
  p.ld_out = m <= 1 ? n : orow.row_stride;
  p.x = xr.data;
  p.ldx = x_ld;
  p.g = norm_weight.data();
  p.w = wr.data;
  p.ldw = w_ld;
  p.m = m;
  p.n = n;
  p.k = k;
  p.eps = eps;
  p.in_dtype = dt;
  p.g_dtype = norm_weight.dtype();

  if (!x.is_cuda()) return detail::rmsnorm_linear_cpu(p);
  detail::DeviceGuard guard(op, "x", x);
  if (k == 0) {
    // An empty sum: out = 0, without asking the kernel to handle an empty row.
    const size_t es = static_cast<size_t>(dtype_size(dt));
    LLMK_CUDA_CHECK(cudaMemset2DAsync(p.out, static_cast<size_t>(p.ld_out) * es, 0, static_cast<size_t>(n) * es,
                                      static_cast<size_t>(m), stream));
    return;
  }
  if (rmsnorm_then_gemm(p, x.device(), stream)) return;
  detail::rmsnorm_linear_cuda(p, stream);
}

}  // namespace llmk
