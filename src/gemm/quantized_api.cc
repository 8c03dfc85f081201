// Public entry points of quantized_gemm and its format (include/llmk/quantized_gemm.h):
// validate every argument (a rejected call writes nothing), then the CPU reference or a CUDA
// path: the Hopper kernel for int4 at kQuantizedSm90FromM <= m <= kQuantizedSm90MaxM where it
// runs, else the weight-streaming kernel for m <= kQuantizedStreamMaxM, else dequantize + gemm
// per slab; LLMK_QUANTIZED_PATH (auto | stream | dequant | sm90) forces one.
#include <algorithm>
#include <string>
#include <vector>

#include "common/cuda_check.h"
#include "common/env_path.h"
#include "common/rows.h"
#include "gemm/quantized.h"
#include "llmk/gemm.h"
#include "llmk/quantized_gemm.h"

namespace llmk {

namespace {

enum class Path { automatic, stream, dequant, sm90 };

Path requested_path(const char* op) {
  return static_cast<Path>(detail::env_path(op, "LLMK_QUANTIZED_PATH", {"auto", "stream", "dequant", "sm90"}));
}

// Whether the call needs no workspace (any path but dequantize + gemm).
bool streams(const char* op, int64_t m) {
  const Path path = requested_path(op);
  return path == Path::stream || path == Path::sm90 ||
         (path == Path::automatic && m <= detail::kQuantizedStreamMaxM);
}

void check_contiguous(const char* op, const char* arg, const TensorView& t) {
  LLMK_CHECK(detail::is_contiguous(t), op, ": ", arg, " must be contiguous, got shape ", detail::shape_string(t));
}

// w's tensors against K (from x or the weight) and the dtype of the scales; returns N and
// fills the format fields of p.
int64_t check_weight(const char* op, const QuantizedWeight& w, int64_t k, DType dtype, const TensorView& ref,
                     const char* ref_arg, detail::QuantizedParams& p) {
  LLMK_CHECK(w.bits == 4 || w.bits == 8, op, ": bits must be 4 or 8, got ", w.bits);
  const int block = detail::quantized_block_k(w.bits);
  LLMK_CHECK(k % block == 0, op, ": K = ", k, " must be a multiple of ", block, " for ", w.bits,
             "-bit weights (llmk's packed layout stores ", block, " codes per 64-byte block of a row)");
  LLMK_CHECK(w.group_size > 0 && w.group_size % block == 0 && (k == 0 || k % w.group_size == 0), op,
             ": group_size ", w.group_size, " must be a multiple of ", block, " that divides K = ", k,
             " (use group_size = K for one scale per output channel)");
  detail::check_dtype(op, "packed", w.packed, DType::i32);
  LLMK_CHECK(w.packed.ndim() == 2 && w.packed.size(1) == k * w.bits / 32, op, ": packed has shape ",
             detail::shape_string(w.packed), ", expected [N, ", k * w.bits / 32, "] (K * bits / 32 int32 words per row)");
  const int64_t n = w.packed.size(0), groups = k / w.group_size;
  check_contiguous(op, "packed", w.packed);
  LLMK_CHECK(w.scales.dtype() == dtype, op, ": scales have dtype ", dtype_name(w.scales.dtype()), ", expected ",
             dtype_name(dtype));
  LLMK_CHECK(w.scales.ndim() == 2 && w.scales.size(0) == n && w.scales.size(1) == groups, op,
             ": scales have shape ", detail::shape_string(w.scales), ", expected [", n, ", ", groups,
             "] (N, K / group_size)");
  check_contiguous(op, "scales", w.scales);
  detail::check_same_device(op, "packed", w.packed, ref_arg, ref);
  detail::check_same_device(op, "scales", w.scales, ref_arg, ref);
  if (w.zeros) {
    detail::check_dtype(op, "zeros", *w.zeros, DType::u8);
    LLMK_CHECK(w.zeros->ndim() == 2 && w.zeros->size(0) == n && w.zeros->size(1) == groups, op,
               ": zeros have shape ", detail::shape_string(*w.zeros), ", expected [", n, ", ", groups, "]");
    check_contiguous(op, "zeros", *w.zeros);
    detail::check_same_device(op, "zeros", *w.zeros, ref_arg, ref);
  }
  LLMK_CHECK(w.packed.numel() == 0 || detail::is_aligned(w.packed.data(), 16), op, ": packed data pointer ",
             w.packed.data(), " is not 16-byte aligned");
  p.packed = static_cast<const int32_t*>(w.packed.data());
  p.scales = w.scales.data();
  p.zeros = w.zeros ? static_cast<const uint8_t*>(w.zeros->data()) : nullptr;
  p.bits = w.bits;
  p.group_size = w.group_size;
  p.n = n;
  p.k = k;
  p.dtype = dtype;
  return n;
}

void check_half_dtype(const char* op, const char* arg, DType dtype) {
  LLMK_CHECK(dtype == DType::f16 || dtype == DType::bf16, op, ": ", arg, " has dtype ", dtype_name(dtype),
             ", expected float16 or bfloat16");
}

// The dequantize-then-GEMM path: per slab of rows, dequantize into the workspace and run
// llmk::gemm into out's matching columns.
void dequant_gemm_cuda(const detail::QuantizedParams& p, const TensorView& x, cudaStream_t stream) {
  const Device dev = x.device();
  const int64_t es = dtype_size(p.dtype);
  for (int64_t n0 = 0; n0 < p.n; n0 += detail::kQuantizedSlabRows) {
    const int64_t ns = std::min(detail::kQuantizedSlabRows, p.n - n0);
    detail::QuantizedParams slab = p;
    slab.n = ns;
    slab.packed = p.packed + n0 * (p.k * p.bits / 32);
    slab.scales = static_cast<const char*>(p.scales) + n0 * (p.k / p.group_size) * es;
    slab.zeros = p.zeros ? p.zeros + n0 * (p.k / p.group_size) : nullptr;
    detail::dequantize_weight_cuda(slab, p.workspace, p.k, stream);
    const int64_t a_shape[2] = {p.m, p.k}, a_strides[2] = {p.ldx, 1};
    const int64_t b_shape[2] = {ns, p.k}, b_strides[2] = {p.k, 1};
    const int64_t o_shape[2] = {p.m, ns}, o_strides[2] = {p.ld_out, 1};
    const TensorView a(const_cast<void*>(p.x), p.dtype, dev, 2, a_shape, a_strides);
    const TensorView b(p.workspace, p.dtype, dev, 2, b_shape, b_strides);
    const TensorView o(static_cast<char*>(p.out) + n0 * es, p.dtype, dev, 2, o_shape, o_strides);
    GemmEpilogue epilogue;
    if (p.bias) {
      const int64_t v_shape[1] = {ns}, v_strides[1] = {1};
      epilogue.bias = TensorView(const_cast<char*>(static_cast<const char*>(p.bias)) + n0 * es, p.dtype, dev, 1,
                                 v_shape, v_strides);
    }
    gemm(o, a, b, epilogue, stream);
  }
}

}  // namespace

int64_t quantized_gemm_workspace_size(int64_t m, int64_t n, int64_t k, int device) {
  (void)device;
  if (m <= 0 || n <= 0 || k <= 0 || streams("quantized_gemm", m)) return 0;
  return std::min(n, detail::kQuantizedSlabRows) * k;
}

void quantized_gemm(const TensorView& out, const TensorView& x, const QuantizedWeight& w,
                    const std::optional<TensorView>& bias, const std::optional<TensorView>& workspace,
                    cudaStream_t stream) {
  const char* op = "quantized_gemm";
  check_half_dtype(op, "x", x.dtype());
  const DType dt = x.dtype();
  const detail::Rows xr = detail::as_rows(op, "x", x);
  const int64_t m = xr.rows, k = xr.d;
  detail::QuantizedParams p{};
  const int64_t n = check_weight(op, w, k, dt, x, "x", p);
  LLMK_CHECK(out.dtype() == dt, op, ": out has dtype ", dtype_name(out.dtype()), ", expected ", dtype_name(dt),
             " (x's)");
  detail::check_same_device(op, "out", out, "x", x);
  bool shape_ok = out.ndim() == x.ndim() && out.size(-1) == n;
  for (int i = 0; shape_ok && i + 1 < x.ndim(); ++i) shape_ok = out.size(i) == x.size(i);
  LLMK_CHECK(shape_ok, op, ": out has shape ", detail::shape_string(out), ", expected x's leading dims of ",
             detail::shape_string(x), " and a last dim of ", n, " (the weight's N)");
  const detail::Rows orow = detail::as_rows(op, "out", out);
  if (bias) {
    LLMK_CHECK(bias->dtype() == dt, op, ": bias has dtype ", dtype_name(bias->dtype()), ", expected ",
               dtype_name(dt), " (x's)");
    detail::check_same_device(op, "bias", *bias, "x", x);
    detail::check_vector(op, "bias", *bias, n);
  }
  const int64_t ldx = m <= 1 ? std::max<int64_t>(k, 1) : xr.row_stride;
  if (m * k > 0) {
    LLMK_CHECK(detail::is_aligned(xr.data, 16), op, ": x data pointer ", xr.data, " is not 16-byte aligned");
    LLMK_CHECK(m <= 1 || (ldx * dtype_size(dt)) % 16 == 0, op, ": x has a row stride of ", ldx,
               " elements, not a multiple of 16 bytes (the rows of x must be 16-byte aligned)");
  }
  detail::check_no_overlap(op, "out", out, "x", x, false);
  detail::check_no_overlap(op, "out", out, "packed", w.packed, false);
  detail::check_no_overlap(op, "out", out, "scales", w.scales, false);
  if (w.zeros) detail::check_no_overlap(op, "out", out, "zeros", *w.zeros, false);
  if (bias) detail::check_no_overlap(op, "out", out, "bias", *bias, false);

  const bool stream_path = streams(op, m);
  const int64_t needed = x.is_cuda() ? quantized_gemm_workspace_size(m, n, k, x.device().index) : 0;
  if (needed > 0) {
    detail::check_workspace(op, workspace, x, needed, "quantized_gemm_workspace_size", dt);
    detail::check_no_overlap(op, "out", out, "workspace", *workspace, false);
    p.workspace = workspace->data();
    p.workspace_elems = workspace->numel();
  }

  if (m == 0 || n == 0) return;
  p.out = orow.data;
  p.ld_out = m <= 1 ? n : orow.row_stride;
  p.x = xr.data;
  p.ldx = ldx;
  p.bias = bias ? bias->data() : nullptr;
  p.m = m;
  if (!x.is_cuda()) return detail::quantized_gemm_cpu(p);
  detail::DeviceGuard guard(op, "x", x);
  if (k == 0) {  // an empty sum: out = bias (or 0)
    const size_t es = static_cast<size_t>(dtype_size(dt));
    if (!p.bias) {
      LLMK_CUDA_CHECK(cudaMemset2DAsync(p.out, static_cast<size_t>(p.ld_out) * es, 0, static_cast<size_t>(n) * es,
                                        static_cast<size_t>(m), stream));
      return;
    }
    for (int64_t i = 0; i < m; ++i)
      LLMK_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(p.out) + i * p.ld_out * es, p.bias, static_cast<size_t>(n) * es,
                                      cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const Path path = requested_path(op);
  const int device = x.device().index;
  if (path == Path::sm90) {
    LLMK_CHECK(detail::quantized_sm90_takes(p, device), op, ": LLMK_QUANTIZED_PATH=sm90 cannot take this call (m ", m,
               ", k ", k, ", ", p.bits, " bits, group ", p.group_size, ", device ", device,
               "; it needs int4 codes, m <= ", detail::kQuantizedSm90MaxM,
               ", k and the group size multiples of 128, an sm_90 device and an sm_90a build)");
    return detail::quantized_gemm_sm90_cuda(p, stream);
  }
  if (path == Path::automatic && m >= detail::kQuantizedSm90FromM && detail::quantized_sm90_takes(p, device))
    return detail::quantized_gemm_sm90_cuda(p, stream);
  if (stream_path) return detail::quantized_gemm_stream_cuda(p, stream);
  dequant_gemm_cuda(p, x, stream);
}

void dequantize_weight(const TensorView& out, const QuantizedWeight& w, cudaStream_t stream) {
  const char* op = "dequantize_weight";
  check_half_dtype(op, "scales", w.scales.dtype());
  LLMK_CHECK(w.packed.ndim() == 2, op, ": packed must be 2-d [N, K * bits / 32], got shape ",
             detail::shape_string(w.packed));
  LLMK_CHECK(w.bits == 4 || w.bits == 8, op, ": bits must be 4 or 8, got ", w.bits);
  const int64_t k = w.packed.size(1) * 32 / w.bits;
  detail::QuantizedParams p{};
  const int64_t n = check_weight(op, w, k, w.scales.dtype(), w.packed, "packed", p);
  LLMK_CHECK(out.dtype() == w.scales.dtype(), op, ": out has dtype ", dtype_name(out.dtype()), ", expected ",
             dtype_name(w.scales.dtype()), " (the scales')");
  LLMK_CHECK(out.ndim() == 2 && out.size(0) == n && out.size(1) == k, op, ": out has shape ",
             detail::shape_string(out), ", expected [", n, ", ", k, "]");
  check_contiguous(op, "out", out);
  detail::check_same_device(op, "out", out, "packed", w.packed);
  detail::check_no_overlap(op, "out", out, "packed", w.packed, false);
  detail::check_no_overlap(op, "out", out, "scales", w.scales, false);
  if (n == 0 || k == 0) return;
  if (!out.is_cuda()) return detail::dequantize_weight_cpu(p, out.data(), k);
  detail::DeviceGuard guard(op, "out", out);
  detail::dequantize_weight_cuda(p, out.data(), k, stream);
}

void quantize_weight(const QuantizedWeight& w, const TensorView& weight) {
  const char* op = "quantize_weight";
  detail::check_float_dtype(op, "weight", weight);
  LLMK_CHECK(weight.ndim() == 2, op, ": weight must be 2-d [N, K], got shape ", detail::shape_string(weight));
  check_contiguous(op, "weight", weight);
  LLMK_CHECK(!weight.is_cuda(), op, ": weight must be in host memory (quantize on the CPU, then copy the packed "
             "tensors to the GPU)");
  check_half_dtype(op, "scales", w.scales.dtype());
  const int64_t k = weight.size(1);
  detail::QuantizedParams p{};
  const int64_t n = check_weight(op, w, k, w.scales.dtype(), weight, "weight", p);
  LLMK_CHECK(n == weight.size(0), op, ": packed has ", n, " rows but weight has ", weight.size(0));
  detail::check_no_overlap(op, "packed", w.packed, "weight", weight, false);
  detail::check_no_overlap(op, "scales", w.scales, "weight", weight, false);
  if (n == 0 || k == 0) return;
  detail::quantize_weight_cpu(w, weight);
}

void pack_quantized_weight(const TensorView& packed, const TensorView& codes, int bits) {
  const char* op = "pack_quantized_weight";
  LLMK_CHECK(bits == 4 || bits == 8, op, ": bits must be 4 or 8, got ", bits);
  detail::check_dtype(op, "codes", codes, DType::u8);
  LLMK_CHECK(codes.ndim() == 2, op, ": codes must be 2-d [N, K], got shape ", detail::shape_string(codes));
  check_contiguous(op, "codes", codes);
  const int64_t n = codes.size(0), k = codes.size(1);
  const int block = detail::quantized_block_k(bits);
  LLMK_CHECK(k % block == 0, op, ": K = ", k, " must be a multiple of ", block, " for ", bits, "-bit codes");
  detail::check_dtype(op, "packed", packed, DType::i32);
  LLMK_CHECK(packed.ndim() == 2 && packed.size(0) == n && packed.size(1) == k * bits / 32, op,
             ": packed has shape ", detail::shape_string(packed), ", expected [", n, ", ", k * bits / 32, "]");
  check_contiguous(op, "packed", packed);
  LLMK_CHECK(!codes.is_cuda() && !packed.is_cuda(), op, ": codes and packed must be in host memory");
  detail::check_no_overlap(op, "packed", packed, "codes", codes, false);
  const uint8_t* c = static_cast<const uint8_t*>(codes.data());
  for (int64_t i = 0; i < n * k; ++i)
    LLMK_CHECK(c[i] < (1 << bits), op, ": codes[", i / std::max<int64_t>(k, 1), ", ", i % std::max<int64_t>(k, 1),
               "] = ", int{c[i]}, " does not fit in ", bits, " bits");
  detail::pack_codes(static_cast<int32_t*>(packed.data()), c, n, k, bits);
}

}  // namespace llmk
