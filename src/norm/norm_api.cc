// Public entry points of the RMSNorm family: validate every argument (a rejected call
// writes nothing), then run the CUDA launcher or the CPU reference.
#include <cmath>

#include "common/cuda_check.h"
#include "common/rows.h"
#include "llmk/norm.h"
#include "norm/norm_launchers.h"

namespace llmk {

using detail::Rows;

namespace {

void check_eps(const char* op, double eps) {
  LLMK_CHECK(std::isfinite(eps) && eps > 0.0, op, ": eps must be a finite number > 0, got ", eps);
}

void check_offset(const char* op, double offset) {
  LLMK_CHECK(std::isfinite(offset), op, ": offset must be finite, got ", offset);
}

void check_float_dtype(const char* op, const char* arg, const TensorView& t) {
  LLMK_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f16 || t.dtype() == DType::bf16,
             op, ": ", arg, " has unsupported dtype ", dtype_name(t.dtype()));
}

// The weight: [d], x's dtype or f32, on x's device.
void check_weight(const char* op, const TensorView& weight, const TensorView& x, int64_t d) {
  detail::check_same_device(op, "weight", weight, "x", x);
  detail::check_vector(op, "weight", weight, d);
  LLMK_CHECK(weight.dtype() == x.dtype() || weight.dtype() == DType::f32, op,
             ": weight has dtype ", dtype_name(weight.dtype()), ", expected ",
             dtype_name(x.dtype()), " (x's) or float32");
}

// A tensor that must match x in shape, dtype and device.
Rows check_like_x(const char* op, const char* arg, const TensorView& t, const TensorView& x) {
  detail::check_same_device(op, arg, t, "x", x);
  detail::check_dtype(op, arg, t, x.dtype());
  detail::check_same_shape(op, arg, t, "x", x);
  return detail::as_rows(op, arg, t);
}

// Rows of x that the shared checks accept; d == 0 is rejected, rows == 0 is a no-op.
Rows check_x(const char* op, const TensorView& x) {
  check_float_dtype(op, "x", x);
  Rows rows = detail::as_rows(op, "x", x);
  LLMK_CHECK(rows.d >= 1, op, ": x has an empty last dim; the hidden size must be >= 1");
  LLMK_CHECK(rows.d <= (int64_t{1} << 24), op, ": hidden size ", rows.d,
             " is larger than the supported 16777216");
  return rows;
}

bool aligned16(const Rows& r, DType dtype) {
  const int64_t elem = dtype_size(dtype);
  return detail::is_aligned(r.data, 16) && (r.rows <= 1 || (r.row_stride * elem) % 16 == 0);
}

// The vector kernels need 16-byte aligned rows, d a multiple of the vector, and a weight
// aligned to one vector of its own dtype.
bool vectorizable(std::initializer_list<Rows> rows, DType act, const TensorView& weight) {
  const int64_t n = 16 / dtype_size(act);
  for (const Rows& r : rows)
    if (r.data != nullptr && (!aligned16(r, act) || r.d % n != 0)) return false;
  return detail::is_aligned(weight.data(), n * dtype_size(weight.dtype()));
}

}  // namespace

void rmsnorm(const TensorView& out, const TensorView& x, const TensorView& weight, double eps,
             double offset, const std::optional<TensorView>& rstd, cudaStream_t stream) {
  const char* op = "rmsnorm";
  const Rows xr = check_x(op, x);
  const Rows outr = check_like_x(op, "out", out, x);
  check_weight(op, weight, x, xr.d);
  check_eps(op, eps);
  check_offset(op, offset);
  detail::check_no_overlap(op, "out", out, "x", x, /*allow_identical=*/true);
  detail::check_no_overlap(op, "out", out, "weight", weight, false);
  if (rstd) {
    detail::check_same_device(op, "rstd", *rstd, "x", x);
    detail::check_dtype(op, "rstd", *rstd, DType::f32);
    detail::check_vector(op, "rstd", *rstd, xr.rows);
    for (const auto& [name, t] : {std::pair{"out", &out}, {"x", &x}, {"weight", &weight}})
      detail::check_no_overlap(op, "rstd", *rstd, name, *t, false);
  }
  if (xr.rows == 0) return;

  detail::RMSNormParams p{};
  p.out = outr.data;
  p.x = xr.data;
  p.weight = weight.data();
  p.rstd = rstd ? static_cast<float*>(rstd->data()) : nullptr;
  p.rows = xr.rows;
  p.d = xr.d;
  p.out_stride = outr.row_stride;
  p.x_stride = xr.row_stride;
  p.eps = static_cast<float>(eps);
  p.offset = static_cast<float>(offset);
  if (!x.is_cuda()) return detail::rmsnorm_cpu(p, x.dtype(), weight.dtype());
  detail::DeviceGuard guard(x.device().index);
  detail::rmsnorm_cuda(p, x.dtype(), weight.dtype(), vectorizable({xr, outr}, x.dtype(), weight),
                       stream);
}

void add_rmsnorm(const TensorView& out, const TensorView& residual_out, const TensorView& x,
                 const TensorView& residual, const TensorView& weight, double eps,
                 double offset, cudaStream_t stream) {
  const char* op = "add_rmsnorm";
  const Rows xr = check_x(op, x);
  const Rows outr = check_like_x(op, "out", out, x);
  const Rows resr = check_like_x(op, "residual", residual, x);
  const Rows res_outr = check_like_x(op, "residual_out", residual_out, x);
  check_weight(op, weight, x, xr.d);
  check_eps(op, eps);
  check_offset(op, offset);
  // In place means out is x and residual_out is residual; outputs are otherwise disjoint
  // from each other and from the inputs (x and residual may share memory: both are read).
  detail::check_no_overlap(op, "out", out, "x", x, true);
  detail::check_no_overlap(op, "residual_out", residual_out, "residual", residual, true);
  detail::check_no_overlap(op, "out", out, "residual", residual, false);
  detail::check_no_overlap(op, "out", out, "residual_out", residual_out, false);
  detail::check_no_overlap(op, "residual_out", residual_out, "x", x, false);
  for (const auto& [name, t] : {std::pair{"out", &out}, {"residual_out", &residual_out}})
    detail::check_no_overlap(op, name, *t, "weight", weight, false);
  if (xr.rows == 0) return;

  detail::RMSNormParams p{};
  p.out = outr.data;
  p.residual_out = res_outr.data;
  p.x = xr.data;
  p.residual = resr.data;
  p.weight = weight.data();
  p.rows = xr.rows;
  p.d = xr.d;
  p.out_stride = outr.row_stride;
  p.residual_out_stride = res_outr.row_stride;
  p.x_stride = xr.row_stride;
  p.residual_stride = resr.row_stride;
  p.eps = static_cast<float>(eps);
  p.offset = static_cast<float>(offset);
  if (!x.is_cuda()) return detail::add_rmsnorm_cpu(p, x.dtype(), weight.dtype());
  detail::DeviceGuard guard(x.device().index);
  detail::add_rmsnorm_cuda(p, x.dtype(), weight.dtype(),
                           vectorizable({xr, outr, resr, res_outr}, x.dtype(), weight), stream);
}

static int sm_count_of(int device_index) {
  int sm_count = 0;
  LLMK_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device_index));
  return sm_count;
}

int64_t rmsnorm_backward_workspace_size(int64_t rows, int64_t d, int device_index) {
  if (rows == 0) return 0;
  return detail::rmsnorm_backward_blocks(rows, sm_count_of(device_index)) * d + rows;
}

void rmsnorm_backward(const TensorView& dx, const TensorView& dweight, const TensorView& dy,
                      const TensorView& x, const TensorView& weight, double eps, double offset,
                      const std::optional<TensorView>& dresidual,
                      const std::optional<TensorView>& workspace, cudaStream_t stream) {
  const char* op = "rmsnorm_backward";
  const Rows xr = check_x(op, x);
  const Rows dyr = check_like_x(op, "dy", dy, x);
  const Rows dxr = check_like_x(op, "dx", dx, x);
  check_weight(op, weight, x, xr.d);
  detail::check_same_device(op, "dweight", dweight, "x", x);
  detail::check_dtype(op, "dweight", dweight, weight.dtype());
  detail::check_vector(op, "dweight", dweight, xr.d);
  check_eps(op, eps);
  check_offset(op, offset);
  Rows dresr{};
  if (dresidual) dresr = check_like_x(op, "dresidual", *dresidual, x);
  for (const auto& [name, t] : {std::pair{"dy", &dy}, {"x", &x}, {"weight", &weight}}) {
    detail::check_no_overlap(op, "dx", dx, name, *t, false);
    detail::check_no_overlap(op, "dweight", dweight, name, *t, false);
  }
  detail::check_no_overlap(op, "dx", dx, "dweight", dweight, false);
  if (dresidual) {
    detail::check_no_overlap(op, "dx", dx, "dresidual", *dresidual, true);
    detail::check_no_overlap(op, "dweight", dweight, "dresidual", *dresidual, false);
  }

  detail::RMSNormBackwardParams p{};
  p.dx = dxr.data;
  p.dweight = dweight.data();
  p.dy = dyr.data;
  p.x = xr.data;
  p.weight = weight.data();
  p.dresidual = dresidual ? dresr.data : nullptr;
  p.rows = xr.rows;
  p.d = xr.d;
  p.dx_stride = dxr.row_stride;
  p.dy_stride = dyr.row_stride;
  p.x_stride = xr.row_stride;
  p.dresidual_stride = dresr.row_stride;
  p.eps = static_cast<float>(eps);
  p.offset = static_cast<float>(offset);
  if (!x.is_cuda()) return detail::rmsnorm_backward_cpu(p, x.dtype(), weight.dtype());

  detail::DeviceGuard guard(x.device().index);
  if (xr.rows == 0) {  // no rows: the weight gradient is zero
    LLMK_CUDA_CHECK(cudaMemsetAsync(dweight.data(), 0, xr.d * dtype_size(dweight.dtype()), stream));
    return;
  }
  const int64_t needed = rmsnorm_backward_workspace_size(xr.rows, xr.d, x.device().index);
  LLMK_CHECK(workspace.has_value(), op, ": CUDA tensors need a float32 workspace of ", needed,
             " elements (rmsnorm_backward_workspace_size)");
  detail::check_same_device(op, "workspace", *workspace, "x", x);
  detail::check_dtype(op, "workspace", *workspace, DType::f32);
  LLMK_CHECK(workspace->ndim() == 1 && workspace->numel() >= needed &&
                 (workspace->numel() <= 1 || workspace->stride(0) == 1),
             op, ": workspace must be a contiguous 1-d float32 tensor of at least ", needed,
             " elements, got ", workspace->numel());
  LLMK_CHECK(detail::is_aligned(workspace->data(), 16), op,
             ": workspace must be 16-byte aligned");
  p.partial = static_cast<float*>(workspace->data());
  const bool vector_ok =
      vectorizable({xr, dyr, dxr, dresidual ? dresr : Rows{}}, x.dtype(), weight);
  detail::rmsnorm_backward_cuda(p, x.dtype(), weight.dtype(), vector_ok, stream);
}

}  // namespace llmk
