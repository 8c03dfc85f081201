// CPU references of the RMSNorm family: the oracle of the GPU tests and the host backend.
// Sums in double; the residual sum of add_rmsnorm is rounded to the dtype before it is
// normalized, as on the GPU.
#include <cmath>
#include <vector>

#include "common/host_types.h"
#include "norm/norm_launchers.h"

namespace llmk::detail {

namespace {

template <class T>
const T* row_ptr(const void* base, int64_t row, int64_t stride) {
  return static_cast<const T*>(base) + row * stride;
}
template <class T>
T* row_ptr(void* base, int64_t row, int64_t stride) {
  return static_cast<T*>(base) + row * stride;
}

template <class T, class W, bool kAdd>
void rmsnorm_rows(const RMSNormParams& p) {
  const W* weight = static_cast<const W*>(p.weight);
  std::vector<double> s(static_cast<size_t>(p.d));
  for (int64_t row = 0; row < p.rows; ++row) {
    const T* x = row_ptr<T>(p.x, row, p.x_stride);
    double sum_sq = 0.0;
    for (int64_t c = 0; c < p.d; ++c) {
      if constexpr (kAdd) {
        const T* res = row_ptr<T>(p.residual, row, p.residual_stride);
        const T sum = from_float<T>(to_float(x[c]) + to_float(res[c]));  // fp32 add, as the GPU
        row_ptr<T>(p.residual_out, row, p.residual_out_stride)[c] = sum;
        s[c] = to_float(sum);
      } else {
        s[c] = to_float(x[c]);
      }
      sum_sq += s[c] * s[c];
    }
    const double r = 1.0 / std::sqrt(sum_sq / double(p.d) + double(p.eps));
    if (p.rstd != nullptr) p.rstd[row] = static_cast<float>(r);
    T* out = row_ptr<T>(p.out, row, p.out_stride);
    for (int64_t c = 0; c < p.d; ++c)
      out[c] = from_float<T>(static_cast<float>(s[c] * r * (double(p.offset) + to_float(weight[c]))));
  }
}

template <class T, class W>
void rmsnorm_backward_rows(const RMSNormBackwardParams& p) {
  const W* weight = static_cast<const W*>(p.weight);
  std::vector<double> dw(static_cast<size_t>(p.d), 0.0);
  for (int64_t row = 0; row < p.rows; ++row) {
    const T* x = row_ptr<T>(p.x, row, p.x_stride);
    const T* dy = row_ptr<T>(p.dy, row, p.dy_stride);
    double sum_sq = 0.0, sum_gx = 0.0;
    for (int64_t c = 0; c < p.d; ++c) {
      const double xf = to_float(x[c]);
      sum_sq += xf * xf;
      sum_gx += double(to_float(dy[c])) * (double(p.offset) + to_float(weight[c])) * xf;
    }
    const double r = 1.0 / std::sqrt(sum_sq / double(p.d) + double(p.eps));
    const double k = r * r * r * sum_gx / double(p.d);
    T* dx = row_ptr<T>(p.dx, row, p.dx_stride);
    for (int64_t c = 0; c < p.d; ++c) {
      const double xf = to_float(x[c]);
      const double dyf = to_float(dy[c]);
      double v = r * dyf * (double(p.offset) + to_float(weight[c])) - xf * k;
      if (p.dresidual != nullptr) v += to_float(row_ptr<T>(p.dresidual, row, p.dresidual_stride)[c]);
      dx[c] = from_float<T>(static_cast<float>(v));
      dw[c] += dyf * xf * r;
    }
  }
  W* dweight = static_cast<W*>(p.dweight);
  for (int64_t c = 0; c < p.d; ++c) dweight[c] = from_float<W>(static_cast<float>(dw[c]));
}

}  // namespace

void rmsnorm_cpu(const RMSNormParams& p, DType act, DType weight) {
  dispatch_act_weight(act, weight, "rmsnorm", [&](auto t, auto w) {
    rmsnorm_rows<host_type_t<decltype(t)>, host_type_t<decltype(w)>, false>(p);
  });
}

void add_rmsnorm_cpu(const RMSNormParams& p, DType act, DType weight) {
  dispatch_act_weight(act, weight, "add_rmsnorm", [&](auto t, auto w) {
    rmsnorm_rows<host_type_t<decltype(t)>, host_type_t<decltype(w)>, true>(p);
  });
}

void rmsnorm_backward_cpu(const RMSNormBackwardParams& p, DType act, DType weight) {
  dispatch_act_weight(act, weight, "rmsnorm_backward", [&](auto t, auto w) {
    rmsnorm_backward_rows<host_type_t<decltype(t)>, host_type_t<decltype(w)>>(p);
  });
}

}  // namespace llmk::detail
