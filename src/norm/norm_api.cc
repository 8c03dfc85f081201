// Public entry points of the normalization family: validate every argument (a rejected
// call writes nothing), then run the CUDA launcher or the CPU reference.
#include <cmath>
#include <initializer_list>
#include <utility>
#include <vector>

#include "common/cuda_check.h"
#include "common/dispatch.h"
#include "common/occupancy.h"
#include "common/rows.h"
#include "llmk/norm.h"
#include "norm/norm_checks.h"
#include "norm/norm_launchers.h"

namespace llmk {

using detail::check_column_param;
using detail::check_eps;
using detail::check_offset;
using detail::Rows;

namespace {

// A tensor that must match x in shape, dtype and device.
Rows check_like_x(const char* op, const char* arg, const TensorView& t, const TensorView& x) {
  return detail::check_like(op, arg, t, "x", x);
}

// A per-row f32 statistic output ([rows]) that must not overlap the op's other tensors.
void check_row_stat(const char* op, const char* arg, const TensorView& t, const TensorView& x,
                    int64_t rows, std::initializer_list<std::pair<const char*, const TensorView*>> others) {
  detail::check_same_device(op, arg, t, "x", x);
  detail::check_dtype(op, arg, t, DType::f32);
  detail::check_vector(op, arg, t, rows);
  for (const auto& [name, other] : others) detail::check_no_overlap(op, arg, t, name, *other, false);
}

// Rows of x that the shared checks accept; d == 0 is rejected, rows == 0 is a no-op.
Rows check_x(const char* op, const TensorView& x) {
  detail::check_float_dtype(op, "x", x);
  Rows rows = detail::as_rows(op, "x", x);
  LLMK_CHECK(rows.d >= 1, op, ": x has an empty last dim (shape ", detail::shape_string(x),
             "); the hidden size must be >= 1");
  LLMK_CHECK(rows.d <= (int64_t{1} << 24), op, ": hidden size ", rows.d,
             " is larger than the supported 16777216");
  return rows;
}

// The vector kernels need rows_vectorizable rows and per-column parameters aligned to one
// vector of their own dtype.
bool vectorizable(std::initializer_list<Rows> rows, DType act,
                  std::initializer_list<const TensorView*> columns) {
  if (!detail::rows_vectorizable(rows, act)) return false;
  const int64_t n = 16 / dtype_size(act);
  for (const TensorView* c : columns)
    if (c != nullptr && !detail::is_aligned(c->data(), n * dtype_size(c->dtype()))) return false;
  return true;
}

// The fields every forward call fills the same way: rows of out and x, and eps.
detail::NormParams forward_params(const Rows& outr, const Rows& xr, double eps) {
  detail::NormParams p{};
  p.out = outr.data;
  p.x = xr.data;
  p.rows = xr.rows;
  p.d = xr.d;
  p.out_stride = outr.row_stride;
  p.x_stride = xr.row_stride;
  p.eps = static_cast<float>(eps);
  return p;
}

// The fields every backward call fills the same way: rows of dx, dy and x, and eps.
detail::NormBackwardParams backward_params(const Rows& dxr, const Rows& dyr, const Rows& xr,
                                           double eps) {
  detail::NormBackwardParams p{};
  p.dx = dxr.data;
  p.dy = dyr.data;
  p.x = xr.data;
  p.rows = xr.rows;
  p.d = xr.d;
  p.dx_stride = dxr.row_stride;
  p.dy_stride = dyr.row_stride;
  p.x_stride = xr.row_stride;
  p.eps = static_cast<float>(eps);
  return p;
}

// A backward call with no rows: the parameter gradients given (non-null) are zero.
void zero_parameter_gradients(std::initializer_list<const TensorView*> grads, int64_t d,
                              cudaStream_t stream) {
  for (const TensorView* grad : grads)
    if (grad != nullptr)
      LLMK_CUDA_CHECK(cudaMemsetAsync(grad->data(), 0, d * dtype_size(grad->dtype()), stream));
}

}  // namespace

namespace {

// rmsnorm, and rmsnorm_swiglu when `gate` is given (out = rmsnorm(x) * silu(gate)).
void rmsnorm_forward(const char* op, const TensorView& out, const TensorView& x, const TensorView* gate,
                     const TensorView& weight, double eps, double offset,
                     const std::optional<TensorView>& rstd, cudaStream_t stream) {
  const Rows xr = check_x(op, x);
  const Rows outr = check_like_x(op, "out", out, x);
  const Rows gater = gate ? check_like_x(op, "gate", *gate, x) : Rows{};
  check_column_param(op, "weight", weight, x, xr.d);
  check_eps(op, eps);
  check_offset(op, offset);
  // Each element of out depends only on the same element of x (and gate) and the row's
  // statistic, computed before any write: out may replace x (or gate).
  detail::check_no_overlap(op, "out", out, "x", x, /*allow_identical=*/true);
  if (gate) detail::check_no_overlap(op, "out", out, "gate", *gate, true);
  detail::check_no_overlap(op, "out", out, "weight", weight, false);
  if (rstd)
    check_row_stat(op, "rstd", *rstd, x, xr.rows,
                   {{"out", &out}, {"x", &x}, {"gate", gate ? gate : &x}, {"weight", &weight}});
  if (xr.rows == 0) return;

  detail::NormParams p = forward_params(outr, xr, eps);
  p.weight = weight.data();
  p.rstd = rstd ? static_cast<float*>(rstd->data()) : nullptr;
  p.offset = static_cast<float>(offset);
  p.gate = gater.data;
  p.gate_stride = gater.row_stride;
  if (!x.is_cuda()) return detail::rmsnorm_cpu(p, x.dtype(), weight.dtype());
  detail::DeviceGuard guard(op, "x", x);
  const bool vector_ok = vectorizable({xr, outr, gater}, x.dtype(), {&weight});
  if (gate) detail::rmsnorm_swiglu_cuda(p, x.dtype(), weight.dtype(), vector_ok, stream);
  else detail::rmsnorm_cuda(p, x.dtype(), weight.dtype(), vector_ok, stream);
}

// rmsnorm_backward, and rmsnorm_swiglu_backward when `gate` and `dgate` are given.
void rmsnorm_backward_impl(const char* op, const TensorView& dx, const TensorView* dgate,
                           const TensorView& dweight, const TensorView& dy, const TensorView& x,
                           const TensorView* gate, const TensorView& weight, double eps, double offset,
                           const std::optional<TensorView>& dresidual,
                           const std::optional<TensorView>& workspace, cudaStream_t stream) {
  const Rows xr = check_x(op, x);
  const Rows dyr = check_like_x(op, "dy", dy, x);
  const Rows dxr = check_like_x(op, "dx", dx, x);
  const Rows gater = gate ? check_like_x(op, "gate", *gate, x) : Rows{};
  const Rows dgater = dgate ? check_like_x(op, "dgate", *dgate, x) : Rows{};
  check_column_param(op, "weight", weight, x, xr.d);
  detail::check_same_device(op, "dweight", dweight, "x", x);
  detail::check_dtype(op, "dweight", dweight, weight.dtype());
  detail::check_vector(op, "dweight", dweight, xr.d);
  check_eps(op, eps);
  check_offset(op, offset);
  Rows dresr{};
  if (dresidual) dresr = check_like_x(op, "dresidual", *dresidual, x);
  // Outputs are disjoint from every input (the long-row path reads x and gate again, for
  // dweight, after dx is written), except that dx may be dresidual.
  std::vector<std::pair<const char*, const TensorView*>> inputs = {{"dy", &dy}, {"x", &x}, {"weight", &weight}};
  if (gate) inputs.emplace_back("gate", gate);
  std::vector<std::pair<const char*, const TensorView*>> outputs = {{"dx", &dx}, {"dweight", &dweight}};
  if (dgate) outputs.emplace_back("dgate", dgate);
  for (const auto& [out_name, out] : outputs)
    for (const auto& [in_name, in] : inputs) detail::check_no_overlap(op, out_name, *out, in_name, *in, false);
  for (size_t a = 0; a < outputs.size(); ++a)
    for (size_t b = a + 1; b < outputs.size(); ++b)
      detail::check_no_overlap(op, outputs[a].first, *outputs[a].second, outputs[b].first, *outputs[b].second, false);
  if (dresidual) {
    detail::check_no_overlap(op, "dx", dx, "dresidual", *dresidual, true);
    detail::check_no_overlap(op, "dweight", dweight, "dresidual", *dresidual, false);
  }

  detail::NormBackwardParams p = backward_params(dxr, dyr, xr, eps);
  p.dweight = dweight.data();
  p.weight = weight.data();
  p.dresidual = dresidual ? dresr.data : nullptr;
  p.dresidual_stride = dresr.row_stride;
  p.offset = static_cast<float>(offset);
  p.gate = gater.data;
  p.gate_stride = gater.row_stride;
  p.dgate = dgater.data;
  p.dgate_stride = dgater.row_stride;
  if (!x.is_cuda()) return detail::rmsnorm_backward_cpu(p, x.dtype(), weight.dtype());

  detail::DeviceGuard guard(op, "x", x);
  if (xr.rows == 0) return zero_parameter_gradients({&dweight}, xr.d, stream);
  detail::check_workspace(op, workspace, x, rmsnorm_backward_workspace_size(xr.rows, xr.d, x.device().index),
                          "rmsnorm_backward_workspace_size");
  p.partial = static_cast<float*>(workspace->data());
  const bool vector_ok =
      vectorizable({xr, dyr, dxr, dresidual ? dresr : Rows{}, gater, dgater}, x.dtype(), {&weight});
  if (gate) detail::rmsnorm_swiglu_backward_cuda(p, x.dtype(), weight.dtype(), vector_ok, stream);
  else detail::rmsnorm_backward_cuda(p, x.dtype(), weight.dtype(), vector_ok, stream);
}

}  // namespace

void rmsnorm(const TensorView& out, const TensorView& x, const TensorView& weight, double eps,
             double offset, const std::optional<TensorView>& rstd, cudaStream_t stream) {
  rmsnorm_forward("rmsnorm", out, x, nullptr, weight, eps, offset, rstd, stream);
}

void rmsnorm_swiglu(const TensorView& out, const TensorView& x, const TensorView& gate,
                    const TensorView& weight, double eps, double offset,
                    const std::optional<TensorView>& rstd, cudaStream_t stream) {
  rmsnorm_forward("rmsnorm_swiglu", out, x, &gate, weight, eps, offset, rstd, stream);
}

namespace {

// add_rmsnorm, and add_rmsnorm_ when `in_place` (out is x and residual_out is residual;
// the messages then name x and residual only).
void add_rmsnorm_impl(const char* op, bool in_place, const TensorView& out, const TensorView& residual_out,
                      const TensorView& x, const TensorView& residual, const TensorView& weight, double eps,
                      double offset, cudaStream_t stream) {
  const char* out_arg = in_place ? "x" : "out";
  const char* res_out_arg = in_place ? "residual" : "residual_out";
  const Rows xr = check_x(op, x);
  const Rows outr = check_like_x(op, out_arg, out, x);
  const Rows resr = check_like_x(op, "residual", residual, x);
  const Rows res_outr = check_like_x(op, res_out_arg, residual_out, x);
  check_column_param(op, "weight", weight, x, xr.d);
  check_eps(op, eps);
  check_offset(op, offset);
  // out may be x and residual_out may be residual; outputs are otherwise disjoint from each
  // other and from the inputs (x and residual may share memory when both are only read).
  detail::check_no_overlap(op, out_arg, out, "x", x, true);
  detail::check_no_overlap(op, res_out_arg, residual_out, "residual", residual, true);
  detail::check_no_overlap(op, out_arg, out, "residual", residual, false);
  detail::check_no_overlap(op, out_arg, out, res_out_arg, residual_out, false);
  detail::check_no_overlap(op, res_out_arg, residual_out, "x", x, false);
  for (const auto& [name, t] : {std::pair{out_arg, &out}, {res_out_arg, &residual_out}})
    detail::check_no_overlap(op, name, *t, "weight", weight, false);
  if (xr.rows == 0) return;

  detail::NormParams p = forward_params(outr, xr, eps);
  p.residual_out = res_outr.data;
  p.residual = resr.data;
  p.weight = weight.data();
  p.residual_out_stride = res_outr.row_stride;
  p.residual_stride = resr.row_stride;
  p.offset = static_cast<float>(offset);
  if (!x.is_cuda()) return detail::add_rmsnorm_cpu(p, x.dtype(), weight.dtype());
  detail::DeviceGuard guard(op, "x", x);
  detail::add_rmsnorm_cuda(p, x.dtype(), weight.dtype(),
                           vectorizable({xr, outr, resr, res_outr}, x.dtype(), {&weight}), stream);
}

}  // namespace

void add_rmsnorm(const TensorView& out, const TensorView& residual_out, const TensorView& x,
                 const TensorView& residual, const TensorView& weight, double eps,
                 double offset, cudaStream_t stream) {
  add_rmsnorm_impl("add_rmsnorm", false, out, residual_out, x, residual, weight, eps, offset, stream);
}

void add_rmsnorm_(const TensorView& x, const TensorView& residual, const TensorView& weight, double eps,
                  double offset, cudaStream_t stream) {
  add_rmsnorm_impl("add_rmsnorm_", true, x, residual, x, residual, weight, eps, offset, stream);
}

int64_t rmsnorm_backward_workspace_size(int64_t rows, int64_t d, int device_index) {
  return detail::rmsnorm_backward_workspace_elems(rows, d, detail::sm_count_of(device_index));
}

int64_t layernorm_backward_workspace_size(int64_t rows, int64_t d, int device_index) {
  return detail::layernorm_backward_workspace_elems(rows, d, detail::sm_count_of(device_index));
}

void rmsnorm_backward(const TensorView& dx, const TensorView& dweight, const TensorView& dy,
                      const TensorView& x, const TensorView& weight, double eps, double offset,
                      const std::optional<TensorView>& dresidual,
                      const std::optional<TensorView>& workspace, cudaStream_t stream) {
  rmsnorm_backward_impl("rmsnorm_backward", dx, nullptr, dweight, dy, x, nullptr, weight, eps, offset,
                        dresidual, workspace, stream);
}

void rmsnorm_swiglu_backward(const TensorView& dx, const TensorView& dgate,
                             const TensorView& dweight, const TensorView& dy,
                             const TensorView& x, const TensorView& gate,
                             const TensorView& weight, double eps, double offset,
                             const std::optional<TensorView>& workspace, cudaStream_t stream) {
  rmsnorm_backward_impl("rmsnorm_swiglu_backward", dx, &dgate, dweight, dy, x, &gate, weight, eps, offset,
                        std::nullopt, workspace, stream);
}

namespace {

// The dtype of layernorm's per-column parameters: the weight's, else the bias's, else x's.
DType affine_dtype(const char* op, const TensorView& x, const std::optional<TensorView>& weight,
                   const std::optional<TensorView>& bias) {
  if (weight && bias)
    LLMK_CHECK(weight->dtype() == bias->dtype(), op, ": weight is ", dtype_name(weight->dtype()),
               " but bias is ", dtype_name(bias->dtype()), "; they must match");
  return weight ? weight->dtype() : bias ? bias->dtype() : x.dtype();
}

}  // namespace

void layernorm(const TensorView& out, const TensorView& x, const std::optional<TensorView>& weight,
               const std::optional<TensorView>& bias, double eps,
               const std::optional<TensorView>& mean, const std::optional<TensorView>& rstd,
               cudaStream_t stream) {
  const char* op = "layernorm";
  const Rows xr = check_x(op, x);
  const Rows outr = check_like_x(op, "out", out, x);
  if (weight) check_column_param(op, "weight", *weight, x, xr.d);
  if (bias) check_column_param(op, "bias", *bias, x, xr.d);
  const DType affine = affine_dtype(op, x, weight, bias);
  check_eps(op, eps);
  detail::check_no_overlap(op, "out", out, "x", x, /*allow_identical=*/true);
  if (weight) detail::check_no_overlap(op, "out", out, "weight", *weight, false);
  if (bias) detail::check_no_overlap(op, "out", out, "bias", *bias, false);
  if (mean) check_row_stat(op, "mean", *mean, x, xr.rows, {{"out", &out}, {"x", &x}});
  if (rstd) check_row_stat(op, "rstd", *rstd, x, xr.rows, {{"out", &out}, {"x", &x}});
  if (mean && rstd) detail::check_no_overlap(op, "mean", *mean, "rstd", *rstd, false);
  if (xr.rows == 0) return;

  detail::NormParams p = forward_params(outr, xr, eps);
  p.weight = weight ? weight->data() : nullptr;
  p.bias = bias ? bias->data() : nullptr;
  p.mean = mean ? static_cast<float*>(mean->data()) : nullptr;
  p.rstd = rstd ? static_cast<float*>(rstd->data()) : nullptr;
  if (!x.is_cuda()) return detail::layernorm_cpu(p, x.dtype(), affine);
  detail::DeviceGuard guard(op, "x", x);
  const bool vector_ok = vectorizable({xr, outr}, x.dtype(),
                                      {weight ? &*weight : nullptr, bias ? &*bias : nullptr});
  detail::layernorm_cuda(p, x.dtype(), affine, vector_ok, stream);
}

void layernorm_backward(const TensorView& dx, const std::optional<TensorView>& dweight,
                        const std::optional<TensorView>& dbias, const TensorView& dy,
                        const TensorView& x, const std::optional<TensorView>& weight, double eps,
                        const std::optional<TensorView>& mean, const std::optional<TensorView>& rstd,
                        const std::optional<TensorView>& workspace, cudaStream_t stream) {
  const char* op = "layernorm_backward";
  const Rows xr = check_x(op, x);
  const Rows dyr = check_like_x(op, "dy", dy, x);
  const Rows dxr = check_like_x(op, "dx", dx, x);
  if (weight) check_column_param(op, "weight", *weight, x, xr.d);
  LLMK_CHECK(!dweight || weight, op, ": dweight needs the weight it is the gradient of");
  if (dweight) check_column_param(op, "dweight", *dweight, x, xr.d);
  if (dbias) check_column_param(op, "dbias", *dbias, x, xr.d);
  const DType affine = affine_dtype(op, x, weight, dbias);
  if (dweight) detail::check_dtype(op, "dweight", *dweight, affine);
  check_eps(op, eps);
  for (const auto& [name, t] : {std::pair{"dy", &dy}, {"x", &x}})
    detail::check_no_overlap(op, "dx", dx, name, *t, false);
  for (const auto* grad : {dweight ? &*dweight : nullptr, dbias ? &*dbias : nullptr}) {
    if (grad == nullptr) continue;
    for (const auto& [name, t] : {std::pair{"dx", &dx}, {"dy", &dy}, {"x", &x}})
      detail::check_no_overlap(op, "a parameter gradient", *grad, name, *t, false);
    if (weight) detail::check_no_overlap(op, "a parameter gradient", *grad, "weight", *weight, false);
  }
  if (weight) detail::check_no_overlap(op, "dx", dx, "weight", *weight, false);
  if (dweight && dbias) detail::check_no_overlap(op, "dweight", *dweight, "dbias", *dbias, false);
  LLMK_CHECK(mean.has_value() == rstd.has_value(), op, ": mean and rstd go together (the forward's "
             "statistics), got ", mean ? "mean" : "rstd", " alone");
  for (const auto& [name, stat] : {std::pair{"mean", &mean}, {"rstd", &rstd}}) {
    if (!*stat) continue;
    check_row_stat(op, name, **stat, x, xr.rows, {{"dx", &dx}});
    for (const auto* grad : {dweight ? &*dweight : nullptr, dbias ? &*dbias : nullptr})
      if (grad != nullptr) detail::check_no_overlap(op, name, **stat, "a parameter gradient", *grad, false);
  }

  detail::NormBackwardParams p = backward_params(dxr, dyr, xr, eps);
  p.dweight = dweight ? dweight->data() : nullptr;
  p.dbias = dbias ? dbias->data() : nullptr;
  p.weight = weight ? weight->data() : nullptr;
  p.saved_mean = mean ? static_cast<const float*>(mean->data()) : nullptr;
  p.saved_rstd = rstd ? static_cast<const float*>(rstd->data()) : nullptr;
  if (!x.is_cuda()) return detail::layernorm_backward_cpu(p, x.dtype(), affine);

  detail::DeviceGuard guard(op, "x", x);
  if (xr.rows == 0)
    return zero_parameter_gradients({dweight ? &*dweight : nullptr, dbias ? &*dbias : nullptr},
                                    xr.d, stream);
  detail::check_workspace(op, workspace, x, layernorm_backward_workspace_size(xr.rows, xr.d, x.device().index),
                          "layernorm_backward_workspace_size");
  p.partial = static_cast<float*>(workspace->data());
  const bool vector_ok = vectorizable({xr, dyr, dxr}, x.dtype(), {weight ? &*weight : nullptr});
  detail::layernorm_backward_cuda(p, x.dtype(), affine, vector_ok, stream);
}

}  // namespace llmk
