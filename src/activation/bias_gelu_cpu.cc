// CPU reference of bias_gelu: double math, one rounding per output; dbias summed in
// double over the rows. The oracle of the GPU tests and the host backend.
#include <vector>

#include "activation/bias_gelu_params.h"
#include "common/host_types.h"

namespace llmk::detail {

namespace {

template <class T>
void forward_rows(const BiasGeluParams& p, Activation act) {
  const T* bias = static_cast<const T*>(p.bias);
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
    T* out = static_cast<T*>(p.out) + r * p.out_stride;
    for (int64_t c = 0; c < p.d; ++c) {
      double v, slope;
      act_value_and_slope(act, double(to_float(x[c])) + to_float(bias[c]), v, slope);
      out[c] = from_float<T>(static_cast<float>(v));
    }
  }
}

template <class T>
void backward_rows(const BiasGeluBackwardParams& p, Activation act) {
  const T* bias = static_cast<const T*>(p.bias);
  std::vector<double> db(static_cast<size_t>(p.d), 0.0);
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
    const T* dy = static_cast<const T*>(p.dy) + r * p.dy_stride;
    T* dx = static_cast<T*>(p.dx) + r * p.dx_stride;
    for (int64_t c = 0; c < p.d; ++c) {
      double v, slope;
      act_value_and_slope(act, double(to_float(x[c])) + to_float(bias[c]), v, slope);
      const double g = to_float(dy[c]) * slope;  // read before dx (which may be x or dy)
      dx[c] = from_float<T>(static_cast<float>(g));
      db[c] += g;
    }
  }
  for (int64_t c = 0; c < p.d; ++c) static_cast<T*>(p.dbias)[c] = from_float<T>(static_cast<float>(db[c]));
}

}  // namespace

void bias_gelu_cpu(const BiasGeluParams& p, Activation act, DType dtype) {
  dispatch_dtype(dtype, "bias_gelu", [&](auto tag) { forward_rows<host_type_t<decltype(tag)>>(p, act); });
}

void bias_gelu_backward_cpu(const BiasGeluBackwardParams& p, Activation act, DType dtype) {
  dispatch_dtype(dtype, "bias_gelu_backward", [&](auto tag) { backward_rows<host_type_t<decltype(tag)>>(p, act); });
}

}  // namespace llmk::detail
