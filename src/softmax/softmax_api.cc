// Public entry points of the softmax family: validate every argument (a rejected call
// writes nothing), then run the CUDA launcher or the CPU reference.
#include <cmath>

#include "common/cuda_check.h"
#include "common/rows.h"
#include "llmk/softmax.h"
#include "softmax/softmax_launchers.h"

namespace llmk {

using detail::Rows;

namespace {

constexpr double kLog2e = 1.4426950408889634;

// The kernels multiply by scale and by scale * log2(e) in float32: both must be finite.
void check_scale(const char* op, double scale) {
  LLMK_CHECK(std::isfinite(scale) && std::isfinite(static_cast<float>(scale * kLog2e)), op,
             ": scale must be finite in float32, times log2(e) (|scale| < 2.3e38), got ", scale);
}

void forward(const char* op, bool log, const TensorView& out, const TensorView& x, double scale,
             cudaStream_t stream) {
  detail::check_float_dtype(op, "x", x);
  const Rows xr = detail::as_rows(op, "x", x);
  const Rows outr = detail::check_like(op, "out", out, "x", x);
  check_scale(op, scale);
  detail::check_no_overlap(op, "out", out, "x", x, /*allow_identical=*/true);
  if (xr.rows == 0 || xr.d == 0) return;
  const detail::SoftmaxParams p{outr.data, xr.data, xr.rows, xr.d, outr.row_stride, xr.row_stride,
                                static_cast<float>(scale), std::signbit(scale) ? -1.0f : 1.0f,
                                static_cast<float>(scale * kLog2e)};
  if (!x.is_cuda()) return detail::softmax_cpu(p, log, x.dtype());
  detail::DeviceGuard guard(op, "x", x);
  detail::softmax_cuda(p, log, x.dtype(), detail::rows_vectorizable({xr, outr}, x.dtype()), stream);
}

void backward(const char* op, bool log, const TensorView& dx, const TensorView& dy,
              const TensorView& y, double scale, cudaStream_t stream) {
  detail::check_float_dtype(op, "y", y);
  const Rows yr = detail::as_rows(op, "y", y);
  const Rows dyr = detail::check_like(op, "dy", dy, "y", y);
  const Rows dxr = detail::check_like(op, "dx", dx, "y", y);
  check_scale(op, scale);
  detail::check_no_overlap(op, "dx", dx, "dy", dy, true);
  detail::check_no_overlap(op, "dx", dx, "y", y, true);
  if (yr.rows == 0 || yr.d == 0) return;
  const detail::SoftmaxBackwardParams p{dxr.data,       dyr.data,       yr.data,
                                        yr.rows,        yr.d,           dxr.row_stride,
                                        dyr.row_stride, yr.row_stride,  static_cast<float>(scale)};
  if (!y.is_cuda()) return detail::softmax_backward_cpu(p, log, y.dtype());
  detail::DeviceGuard guard(op, "y", y);
  detail::softmax_backward_cuda(p, log, y.dtype(), detail::rows_vectorizable({yr, dyr, dxr}, y.dtype()),
                                stream);
}

}  // namespace

void softmax(const TensorView& out, const TensorView& x, double scale, cudaStream_t stream) {
  forward("softmax", false, out, x, scale, stream);
}

void log_softmax(const TensorView& out, const TensorView& x, double scale, cudaStream_t stream) {
  forward("log_softmax", true, out, x, scale, stream);
}

void softmax_backward(const TensorView& dx, const TensorView& dy, const TensorView& y, double scale,
                      cudaStream_t stream) {
  backward("softmax_backward", false, dx, dy, y, scale, stream);
}

void log_softmax_backward(const TensorView& dx, const TensorView& dy, const TensorView& y,
                          double scale, cudaStream_t stream) {
  backward("log_softmax_backward", true, dx, dy, y, scale, stream);
}

}  // namespace llmk
