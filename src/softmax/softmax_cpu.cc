// CPU references of the softmax family: double math, one rounding per output. The oracle
// of the GPU tests and the host backend. Same masking rules as the GPU kernels.
#include <cmath>
#include <limits>
#include <vector>

#include "common/host_types.h"
#include "softmax/softmax_launchers.h"

namespace llmk::detail {

namespace {

template <class T>
void forward_rows(const SoftmaxParams& p, bool log) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> t(static_cast<size_t>(p.n));
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
    double m = -inf;
    for (int64_t c = 0; c < p.n; ++c) {
      t[c] = static_cast<double>(p.scale) * to_float(x[c]);
      m = std::isnan(t[c]) || std::isnan(m) ? NAN : std::max(m, t[c]);
    }
    double sum = 0.0;
    if (m != -inf)
      for (int64_t c = 0; c < p.n; ++c) sum += std::exp(t[c] - m);
    const bool masked = sum == 0.0;
    T* out = static_cast<T*>(p.out) + r * p.out_stride;
    for (int64_t c = 0; c < p.n; ++c) {
      const double y = log ? (masked ? -inf : t[c] - m - std::log(sum))
                           : (masked ? 0.0 : std::exp(t[c] - m) / sum);
      out[c] = from_float<T>(static_cast<float>(y));
    }
  }
}

template <class T>
void backward_rows(const SoftmaxBackwardParams& p, bool log) {
  std::vector<double> y(static_cast<size_t>(p.n)), dy(static_cast<size_t>(p.n));
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* yr = static_cast<const T*>(p.y) + r * p.y_stride;
    const T* dyr = static_cast<const T*>(p.dy) + r * p.dy_stride;
    double dot = 0.0;
    for (int64_t c = 0; c < p.n; ++c) {
      y[c] = to_float(yr[c]);
      dy[c] = to_float(dyr[c]);
      dot += log ? dy[c] : dy[c] * y[c];
    }
    T* dx = static_cast<T*>(p.dx) + r * p.dx_stride;  // may alias y or dy: both copied above
    for (int64_t c = 0; c < p.n; ++c) {
      const double g = log ? p.scale * (dy[c] - std::exp(y[c]) * dot) : p.scale * y[c] * (dy[c] - dot);
      dx[c] = from_float<T>(static_cast<float>(g));
    }
  }
}

}  // namespace

void softmax_cpu(const SoftmaxParams& p, bool log, DType dtype) {
  dispatch_dtype(dtype, "softmax", [&](auto tag) { forward_rows<host_type_t<decltype(tag)>>(p, log); });
}

void softmax_backward_cpu(const SoftmaxBackwardParams& p, bool log, DType dtype) {
  dispatch_dtype(dtype, "softmax_backward", [&](auto tag) { backward_rows<host_type_t<decltype(tag)>>(p, log); });
}

}  // namespace llmk::detail
