// CPU references of the normalization family: the oracle of the GPU tests and the host
// backend. Sums in double; the residual sum of add_rmsnorm is one fp32 add rounded to the
// dtype before it is normalized, as on the GPU.
#include <cmath>
#include <vector>

#include "common/activation_math.h"
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

// offset + weight[c] (weight 1 when absent) and bias[c] (0 when absent).
template <class W>
double scale_at(const void* weight, double offset, int64_t c) {
  return offset + (weight != nullptr ? to_float(static_cast<const W*>(weight)[c]) : 1.0);
}
template <class W>
double shift_at(const void* bias, int64_t c) {
  return bias != nullptr ? to_float(static_cast<const W*>(bias)[c]) : 0.0;
}

template <class T, class W, bool kAdd, bool kCentered>
void norm_rows(const NormParams& p) {
  std::vector<double> s(static_cast<size_t>(p.d));
  for (int64_t row = 0; row < p.rows; ++row) {
    const T* x = row_ptr<T>(p.x, row, p.x_stride);
    for (int64_t c = 0; c < p.d; ++c) {
      if constexpr (kAdd) {
        const T* res = row_ptr<T>(p.residual, row, p.residual_stride);
        const T sum = from_float<T>(to_float(x[c]) + to_float(res[c]));  // fp32 add, as the GPU
        row_ptr<T>(p.residual_out, row, p.residual_out_stride)[c] = sum;
        s[c] = to_float(sum);
      } else {
        s[c] = to_float(x[c]);
      }
    }
    double mean = 0.0;
    if constexpr (kCentered) {
      for (int64_t c = 0; c < p.d; ++c) mean += s[c];
      mean /= double(p.d);
    }
    double sum_sq = 0.0;
    for (int64_t c = 0; c < p.d; ++c) sum_sq += (s[c] - mean) * (s[c] - mean);
    const double r = 1.0 / std::sqrt(sum_sq / double(p.d) + double(p.eps));
    if (p.rstd != nullptr) p.rstd[row] = static_cast<float>(r);
    if (p.mean != nullptr) p.mean[row] = static_cast<float>(mean);
    T* out = row_ptr<T>(p.out, row, p.out_stride);
    for (int64_t c = 0; c < p.d; ++c) {
      double y = (s[c] - mean) * r * scale_at<W>(p.weight, p.offset, c) + shift_at<W>(p.bias, c);
      if (p.gate != nullptr) {  // rmsnorm_swiglu: y * silu(gate)
        double act, slope;
        act_value_and_slope(Activation::silu, to_float(row_ptr<T>(p.gate, row, p.gate_stride)[c]), act, slope);
        y *= act;
      }
      out[c] = from_float<T>(static_cast<float>(y));
    }
  }
}

template <class T, class W, bool kCentered>
void norm_backward_rows(const NormBackwardParams& p) {
  std::vector<double> dw(static_cast<size_t>(p.d), 0.0), db(static_cast<size_t>(p.d), 0.0);
  std::vector<double> dyn(static_cast<size_t>(p.d)), slope(static_cast<size_t>(p.d));
  for (int64_t row = 0; row < p.rows; ++row) {
    const T* x = row_ptr<T>(p.x, row, p.x_stride);
    const T* dy = row_ptr<T>(p.dy, row, p.dy_stride);
    // The gradient the norm sees: dy, or dy * silu(gate) behind rmsnorm_swiglu's gate.
    for (int64_t c = 0; c < p.d; ++c) {
      dyn[c] = to_float(dy[c]);
      if (p.gate != nullptr) {
        double act;
        act_value_and_slope(Activation::silu, to_float(row_ptr<T>(p.gate, row, p.gate_stride)[c]), act, slope[c]);
        dyn[c] *= act;
      }
    }
    // LayerNorm's statistics: the forward's when given, else recomputed from x.
    const bool saved = kCentered && p.saved_mean != nullptr;
    double mean = 0.0;
    if constexpr (kCentered) {
      if (saved) {
        mean = p.saved_mean[row];
      } else {
        for (int64_t c = 0; c < p.d; ++c) mean += to_float(x[c]);
        mean /= double(p.d);
      }
    }
    double sum_sq = 0.0, sum_gxc = 0.0, sum_g = 0.0;
    for (int64_t c = 0; c < p.d; ++c) {
      const double xc = to_float(x[c]) - mean;
      const double g = dyn[c] * scale_at<W>(p.weight, p.offset, c);
      sum_sq += xc * xc;
      sum_gxc += g * xc;
      sum_g += g;
    }
    const double r = saved ? double(p.saved_rstd[row]) : 1.0 / std::sqrt(sum_sq / double(p.d) + double(p.eps));
    const double mean_gxhat = r * sum_gxc / double(p.d);
    const double mean_g = kCentered ? sum_g / double(p.d) : 0.0;
    T* dx = row_ptr<T>(p.dx, row, p.dx_stride);
    // dresidual is read before dx is written: dx may be dresidual (in place).
    for (int64_t c = 0; c < p.d; ++c) {
      const double xhat = (to_float(x[c]) - mean) * r;
      const double dyf = dyn[c];
      if (p.gate != nullptr)  // dgate = dy * y * silu'(gate), y = xhat * (offset + w)
        row_ptr<T>(p.dgate, row, p.dgate_stride)[c] = from_float<T>(
            static_cast<float>(to_float(dy[c]) * xhat * scale_at<W>(p.weight, p.offset, c) * slope[c]));
      double v = r * (dyf * scale_at<W>(p.weight, p.offset, c) - mean_g - xhat * mean_gxhat);
      if (p.dresidual != nullptr) v += to_float(row_ptr<T>(p.dresidual, row, p.dresidual_stride)[c]);
      dx[c] = from_float<T>(static_cast<float>(v));
      dw[c] += dyf * xhat;
      db[c] += dyf;
    }
  }
  for (int64_t c = 0; c < p.d; ++c) {
    if (p.dweight != nullptr) static_cast<W*>(p.dweight)[c] = from_float<W>(static_cast<float>(dw[c]));
    if (p.dbias != nullptr) static_cast<W*>(p.dbias)[c] = from_float<W>(static_cast<float>(db[c]));
  }
}

}  // namespace

void rmsnorm_cpu(const NormParams& p, DType act, DType weight) {
  dispatch_act_weight(act, weight, "rmsnorm", [&](auto t, auto w) {
    norm_rows<host_type_t<decltype(t)>, host_type_t<decltype(w)>, false, false>(p);
  });
}

void add_rmsnorm_cpu(const NormParams& p, DType act, DType weight) {
  dispatch_act_weight(act, weight, "add_rmsnorm", [&](auto t, auto w) {
    norm_rows<host_type_t<decltype(t)>, host_type_t<decltype(w)>, true, false>(p);
  });
}

void layernorm_cpu(const NormParams& p, DType act, DType affine) {
  dispatch_act_weight(act, affine, "layernorm", [&](auto t, auto w) {
    norm_rows<host_type_t<decltype(t)>, host_type_t<decltype(w)>, false, true>(p);
  });
}

void rmsnorm_backward_cpu(const NormBackwardParams& p, DType act, DType weight) {
  dispatch_act_weight(act, weight, "rmsnorm_backward", [&](auto t, auto w) {
    norm_backward_rows<host_type_t<decltype(t)>, host_type_t<decltype(w)>, false>(p);
  });
}

void layernorm_backward_cpu(const NormBackwardParams& p, DType act, DType affine) {
  dispatch_act_weight(act, affine, "layernorm_backward", [&](auto t, auto w) {
    norm_backward_rows<host_type_t<decltype(t)>, host_type_t<decltype(w)>, true>(p);
  });
}

}  // namespace llmk::detail
