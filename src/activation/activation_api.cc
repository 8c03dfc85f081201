// Public entry points of the gated activations: validate every argument (a rejected call
// writes nothing), then run the CUDA launcher or the CPU reference.
#include <algorithm>
#include <utility>

#include "activation/bias_gelu_params.h"
#include "activation/gated_launchers.h"
#include "common/cuda_check.h"
#include "common/occupancy.h"
#include "common/rows.h"
#include "llmk/activation.h"

namespace llmk {

using detail::Activation;
using detail::Rows;

namespace {

Activation gelu_act(const char* op, GeluApproximation approximate) {
  switch (approximate) {
    case GeluApproximation::none: return Activation::gelu;
    case GeluApproximation::tanh: return Activation::gelu_tanh;
  }
  detail::throw_error(op, ": unknown GELU approximation ", static_cast<int>(approximate));
}

// `t` has ref's device, dtype and leading dims, and a last dim of `last`.
Rows check_leading_dims(const char* op, const char* arg, const TensorView& t,
                        const char* ref_arg, const TensorView& ref, int64_t last) {
  detail::check_same_device(op, arg, t, ref_arg, ref);
  detail::check_dtype(op, arg, t, ref.dtype());
  bool same = t.ndim() == ref.ndim() && t.size(-1) == last;
  for (int i = 0; same && i < t.ndim() - 1; ++i) same = t.size(i) == ref.size(i);
  LLMK_CHECK(same, op, ": ", arg, " must have ", ref_arg, "'s leading dims and a last dim of ",
             last, ", got ", arg, " ", detail::shape_string(t), " and ", ref_arg, " ",
             detail::shape_string(ref));
  return detail::as_rows(op, arg, t);
}

// The rows of the fused input x = [..., 2d] (gate then up).
Rows check_fused_x(const char* op, const TensorView& x) {
  detail::check_float_dtype(op, "x", x);
  const Rows xr = detail::as_rows(op, "x", x);
  LLMK_CHECK(xr.d >= 2 && xr.d % 2 == 0, op,
             ": x's last dim must be even and >= 2 (gate then up halves), got ", xr.d);
  return xr;
}

// The up half of fused rows (the gate half is the rows with d halved).
const void* up_half(const Rows& fused, DType dtype) {
  return static_cast<const char*>(fused.data) + fused.d / 2 * dtype_size(dtype);
}

// The CPU reference for host tensors, else the CUDA launcher on the device of `ref`, the
// argument `ref_arg` of `op`.
template <class Params, class Cpu, class Cuda>
void run(const char* op, const char* ref_arg, const TensorView& ref, const Params& p,
         Activation act, bool vector_ok, cudaStream_t stream, Cpu cpu, Cuda cuda) {
  if (p.rows == 0 || p.d == 0) return;
  if (!ref.is_cuda()) return cpu(p, act, ref.dtype());
  detail::DeviceGuard guard(op, ref_arg, ref);
  cuda(p, act, ref.dtype(), vector_ok, stream);
}

void run_forward(const char* op, const char* ref_arg, const TensorView& ref,
                 const detail::GatedParams& p, Activation act, bool vector_ok, cudaStream_t stream) {
  run(op, ref_arg, ref, p, act, vector_ok, stream, detail::gated_forward_cpu, detail::gated_forward_cuda);
}

void run_backward(const char* op, const char* ref_arg, const TensorView& ref,
                  const detail::GatedBackwardParams& p, Activation act, bool vector_ok,
                  cudaStream_t stream) {
  run(op, ref_arg, ref, p, act, vector_ok, stream, detail::gated_backward_cpu,
      detail::gated_backward_cuda);
}

void fused_forward(const char* op, Activation act, const TensorView& out, const TensorView& x,
                   cudaStream_t stream) {
  const Rows xr = check_fused_x(op, x);
  const int64_t d = xr.d / 2;
  const Rows outr = check_leading_dims(op, "out", out, "x", x, d);
  detail::check_no_overlap(op, "out", out, "x", x, false);
  const detail::GatedParams p{outr.data, xr.data, up_half(xr, x.dtype()), xr.rows, d,
                              outr.row_stride, xr.row_stride, xr.row_stride};
  // The up half starts d elements into the row: aligned when d is a multiple of the vector.
  Rows gate = xr;
  gate.d = d;
  run_forward(op, "x", x, p, act, detail::rows_vectorizable({outr, gate}, x.dtype()), stream);
}

void fused_backward(const char* op, Activation act, const TensorView& dx, const TensorView& dy,
                    const TensorView& x, cudaStream_t stream) {
  const Rows xr = check_fused_x(op, x);
  const int64_t d = xr.d / 2;
  const Rows dxr = check_leading_dims(op, "dx", dx, "x", x, xr.d);
  const Rows dyr = check_leading_dims(op, "dy", dy, "x", x, d);
  detail::check_no_overlap(op, "dx", dx, "x", x, true);
  detail::check_no_overlap(op, "dx", dx, "dy", dy, false);
  const detail::GatedBackwardParams p{dxr.data, const_cast<void*>(up_half(dxr, x.dtype())),
                                      dyr.data, xr.data, up_half(xr, x.dtype()), xr.rows, d,
                                      dxr.row_stride, dxr.row_stride, dyr.row_stride,
                                      xr.row_stride, xr.row_stride};
  Rows gate = xr, dgate = dxr;
  gate.d = dgate.d = d;
  run_backward(op, "x", x, p, act, detail::rows_vectorizable({gate, dgate, dyr}, x.dtype()), stream);
}

// The two-tensor form (swiglu, geglu): gate, up and out are [..., d] tensors of their own.
void two_tensor_forward(const char* op, Activation act, const TensorView& out, const TensorView& gate,
                        const TensorView& up, cudaStream_t stream) {
  detail::check_float_dtype(op, "gate", gate);
  const Rows gr = detail::as_rows(op, "gate", gate);
  const Rows ur = check_leading_dims(op, "up", up, "gate", gate, gr.d);
  const Rows outr = check_leading_dims(op, "out", out, "gate", gate, gr.d);
  detail::check_no_overlap(op, "out", out, "gate", gate, true);
  detail::check_no_overlap(op, "out", out, "up", up, true);
  const detail::GatedParams p{outr.data, gr.data, ur.data, gr.rows, gr.d,
                              outr.row_stride, gr.row_stride, ur.row_stride};
  run_forward(op, "gate", gate, p, act, detail::rows_vectorizable({outr, gr, ur}, gate.dtype()), stream);
}

void two_tensor_backward(const char* op, Activation act, const TensorView& dgate, const TensorView& dup,
                         const TensorView& dy, const TensorView& gate, const TensorView& up,
                         cudaStream_t stream) {
  detail::check_float_dtype(op, "gate", gate);
  const Rows gr = detail::as_rows(op, "gate", gate);
  const Rows ur = check_leading_dims(op, "up", up, "gate", gate, gr.d);
  const Rows dyr = check_leading_dims(op, "dy", dy, "gate", gate, gr.d);
  const Rows dgr = check_leading_dims(op, "dgate", dgate, "gate", gate, gr.d);
  const Rows dur = check_leading_dims(op, "dup", dup, "gate", gate, gr.d);
  // Each gradient may replace its own input; every other pair is disjoint.
  detail::check_no_overlap(op, "dgate", dgate, "gate", gate, true);
  detail::check_no_overlap(op, "dup", dup, "up", up, true);
  detail::check_no_overlap(op, "dgate", dgate, "dup", dup, false);
  for (const auto& [name, t] : {std::pair{"dy", &dy}, {"up", &up}})
    detail::check_no_overlap(op, "dgate", dgate, name, *t, false);
  for (const auto& [name, t] : {std::pair{"dy", &dy}, {"gate", &gate}})
    detail::check_no_overlap(op, "dup", dup, name, *t, false);
  const detail::GatedBackwardParams p{dgr.data, dur.data, dyr.data, gr.data, ur.data, gr.rows,
                                      gr.d, dgr.row_stride, dur.row_stride, dyr.row_stride,
                                      gr.row_stride, ur.row_stride};
  run_backward(op, "gate", gate, p, act,
               detail::rows_vectorizable({gr, ur, dyr, dgr, dur}, gate.dtype()), stream);
}

}  // namespace

void silu_and_mul(const TensorView& out, const TensorView& x, cudaStream_t stream) {
  fused_forward("silu_and_mul", Activation::silu, out, x, stream);
}

void gelu_and_mul(const TensorView& out, const TensorView& x, GeluApproximation approximate,
                  cudaStream_t stream) {
  fused_forward("gelu_and_mul", gelu_act("gelu_and_mul", approximate), out, x, stream);
}

void silu_and_mul_backward(const TensorView& dx, const TensorView& dy, const TensorView& x,
                           cudaStream_t stream) {
  fused_backward("silu_and_mul_backward", Activation::silu, dx, dy, x, stream);
}

void gelu_and_mul_backward(const TensorView& dx, const TensorView& dy, const TensorView& x,
                           GeluApproximation approximate, cudaStream_t stream) {
  const char* op = "gelu_and_mul_backward";
  fused_backward(op, gelu_act(op, approximate), dx, dy, x, stream);
}

void swiglu(const TensorView& out, const TensorView& gate, const TensorView& up,
            cudaStream_t stream) {
  two_tensor_forward("swiglu", Activation::silu, out, gate, up, stream);
}

void geglu(const TensorView& out, const TensorView& gate, const TensorView& up,
           GeluApproximation approximate, cudaStream_t stream) {
  two_tensor_forward("geglu", gelu_act("geglu", approximate), out, gate, up, stream);
}

void swiglu_backward(const TensorView& dgate, const TensorView& dup, const TensorView& dy,
                     const TensorView& gate, const TensorView& up, cudaStream_t stream) {
  two_tensor_backward("swiglu_backward", Activation::silu, dgate, dup, dy, gate, up, stream);
}

void geglu_backward(const TensorView& dgate, const TensorView& dup, const TensorView& dy,
                    const TensorView& gate, const TensorView& up, GeluApproximation approximate,
                    cudaStream_t stream) {
  const char* op = "geglu_backward";
  two_tensor_backward(op, gelu_act(op, approximate), dgate, dup, dy, gate, up, stream);
}

namespace {

// bias: [d] of x's dtype, contiguous, on x's device.
void check_bias(const char* op, const TensorView& bias, const TensorView& x, int64_t d) {
  detail::check_same_device(op, "bias", bias, "x", x);
  detail::check_dtype(op, "bias", bias, x.dtype());
  detail::check_vector(op, "bias", bias, d);
}

bool bias_vector_ok(std::initializer_list<Rows> rows, const TensorView& bias, DType dtype) {
  return detail::rows_vectorizable(rows, dtype) && detail::is_aligned(bias.data(), 16);
}

}  // namespace

void bias_gelu(const TensorView& out, const TensorView& x, const TensorView& bias,
               GeluApproximation approximate, cudaStream_t stream) {
  const char* op = "bias_gelu";
  const Activation act = gelu_act(op, approximate);
  detail::check_float_dtype(op, "x", x);
  const Rows xr = detail::as_rows(op, "x", x);
  const Rows outr = detail::check_like(op, "out", out, "x", x);
  check_bias(op, bias, x, xr.d);
  detail::check_no_overlap(op, "out", out, "x", x, true);
  detail::check_no_overlap(op, "out", out, "bias", bias, false);
  if (xr.rows == 0 || xr.d == 0) return;
  const detail::BiasGeluParams p{outr.data, xr.data, bias.data(), xr.rows, xr.d, outr.row_stride, xr.row_stride};
  if (!x.is_cuda()) return detail::bias_gelu_cpu(p, act, x.dtype());
  detail::DeviceGuard guard(op, "x", x);
  detail::bias_gelu_cuda(p, act, x.dtype(), bias_vector_ok({xr, outr}, bias, x.dtype()), stream);
}

int64_t bias_gelu_backward_workspace_size(int64_t rows, int64_t d, int device_index) {
  if (rows <= 0 || d <= 0) return 0;
  // The most any dtype and alignment uses: 16-byte vectors of 4 (f32) or 8 (f16, bf16)
  // elements, or single elements of 4 or 2 bytes.
  const int sm_count = detail::sm_count_of(device_index);
  int64_t most = 0;
  for (const auto& [vector, bytes] : {std::pair{4, 16}, {8, 16}, {1, 4}, {1, 2}})
    if (d % vector == 0)
      most = std::max(most, detail::bias_gelu_backward_geometry(rows, d, vector, bytes, sm_count).workspace(d));
  return most;
}

void bias_gelu_backward(const TensorView& dx, const TensorView& dbias, const TensorView& dy,
                        const TensorView& x, const TensorView& bias, GeluApproximation approximate,
                        const std::optional<TensorView>& workspace, cudaStream_t stream) {
  const char* op = "bias_gelu_backward";
  const Activation act = gelu_act(op, approximate);
  detail::check_float_dtype(op, "x", x);
  const Rows xr = detail::as_rows(op, "x", x);
  const Rows dyr = detail::check_like(op, "dy", dy, "x", x);
  const Rows dxr = detail::check_like(op, "dx", dx, "x", x);
  check_bias(op, bias, x, xr.d);
  detail::check_same_device(op, "dbias", dbias, "x", x);
  detail::check_dtype(op, "dbias", dbias, x.dtype());
  detail::check_vector(op, "dbias", dbias, xr.d);
  // dx may replace x or dy (each element is read before it is written, by the same thread).
  detail::check_no_overlap(op, "dx", dx, "x", x, true);
  detail::check_no_overlap(op, "dx", dx, "dy", dy, true);
  for (const auto& [name, t] : {std::pair{"dx", &dx}, {"dy", &dy}, {"x", &x}, {"bias", &bias}})
    detail::check_no_overlap(op, "dbias", dbias, name, *t, false);
  detail::check_no_overlap(op, "dx", dx, "bias", bias, false);
  detail::BiasGeluBackwardParams p{dxr.data, dbias.data(), dyr.data, xr.data, bias.data(), nullptr, nullptr,
                                   xr.rows, xr.d, dxr.row_stride, dyr.row_stride, xr.row_stride};
  if (xr.d == 0) return;
  if (!x.is_cuda()) return detail::bias_gelu_backward_cpu(p, act, x.dtype());
  detail::DeviceGuard guard(op, "x", x);
  if (xr.rows == 0) {
    LLMK_CUDA_CHECK(cudaMemsetAsync(dbias.data(), 0, xr.d * dtype_size(x.dtype()), stream));
    return;
  }
  const int64_t needed = bias_gelu_backward_workspace_size(xr.rows, xr.d, x.device().index);
  detail::check_workspace(op, workspace, x, needed, "bias_gelu_backward_workspace_size");
  p.partial = static_cast<float*>(workspace->data());
  const bool vector_ok = bias_vector_ok({xr, dyr, dxr}, bias, x.dtype()) && detail::is_aligned(dbias.data(), 16);
  detail::bias_gelu_backward_cuda(p, act, x.dtype(), vector_ok, stream);
}

}  // namespace llmk
