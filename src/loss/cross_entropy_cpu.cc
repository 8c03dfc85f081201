// CPU reference of cross_entropy: double math, one rounding per output. The oracle of the
// GPU tests and the host backend; same rules for ignored rows, -inf logits and fully masked
// rows as the kernels (loss_api.cc rejects out-of-range targets before this runs).
#include <cmath>
#include <limits>
#include <vector>

#include "common/host_types.h"
#include "loss/cross_entropy.h"

namespace llmk::detail {

namespace {

template <class T>
void rows(const CrossEntropyParams& p) {
  const double inf = std::numeric_limits<double>::infinity();
  const double eps = p.label_smoothing, z_loss = p.z_loss, n = static_cast<double>(p.n);
  std::vector<double> z(static_cast<size_t>(p.n));
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* x = static_cast<const T*>(p.logits) + r * p.logits_stride;
    double m = -inf, sum_z = 0.0;
    for (int64_t c = 0; c < p.n; ++c) {
      z[c] = to_float(x[c]);
      m = std::isnan(z[c]) || std::isnan(m) ? NAN : std::max(m, z[c]);
      sum_z += z[c];
    }
    double sum = 0.0;
    if (m != -inf)
      for (int64_t c = 0; c < p.n; ++c) sum += std::exp(z[c] - m);
    const bool masked = sum == 0.0;
    const double log_sum = std::log(sum), lse = m + log_sum;
    const int64_t t = p.target_i64 ? static_cast<const int64_t*>(p.target)[r]
                                   : static_cast<const int32_t*>(p.target)[r];
    const bool ignored = t == p.ignore_index;
    double loss = 0.0;
    if (!ignored && masked) {
      loss = inf;
    } else if (!ignored) {
      if (eps != 1.0) loss += (1.0 - eps) * ((m - z[t]) + log_sum);
      if (eps != 0.0) loss += eps * ((m - sum_z / n) + log_sum);
      if (z_loss != 0.0) loss += z_loss * lse * lse;
    }
    p.loss[r] = static_cast<float>(loss);
    p.lse[r] = static_cast<float>(lse);
    if (p.dlogits == nullptr) continue;
    T* dl = static_cast<T*>(p.dlogits) + r * p.dlogits_stride;  // may be x: the row is in z
    const double g = p.grad_scale;
    const double c_prob = masked ? 0.0 : z_loss != 0.0 ? g * (1.0 + 2.0 * z_loss * lse) : g;
    for (int64_t c = 0; c < p.n; ++c) {
      const double prob = masked ? 0.0 : std::exp(z[c] - m) / sum;
      const double d = ignored ? 0.0 : prob * c_prob - g * eps / n - (c == t ? g * (1.0 - eps) : 0.0);
      dl[c] = from_float<T>(static_cast<float>(d));
    }
  }
}

template <class T>
void backward_rows(const CrossEntropyBackwardParams& p) {
  const double eps = p.label_smoothing, n = static_cast<double>(p.n);
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* x = static_cast<const T*>(p.logits) + r * p.logits_stride;
    T* dx = static_cast<T*>(p.dlogits) + r * p.dlogits_stride;  // may be x: read before written
    const int64_t t = p.target_i64 ? static_cast<const int64_t*>(p.target)[r]
                                   : static_cast<const int32_t*>(p.target)[r];
    const bool ignored = t == p.ignore_index;
    const double g = p.dloss[r], lse = p.lse[r];
    const double c_prob = ignored || std::isinf(lse) ? 0.0 : g * (1.0 + 2.0 * p.z_loss * lse);
    for (int64_t c = 0; c < p.n; ++c) {
      const double prob = c_prob == 0.0 ? 0.0 : std::exp(static_cast<double>(to_float(x[c])) - lse);
      const double d = ignored ? 0.0 : prob * c_prob - g * eps / n - (c == t ? g * (1.0 - eps) : 0.0);
      dx[c] = from_float<T>(static_cast<float>(d));
    }
  }
}

}  // namespace

void cross_entropy_backward_cpu(const CrossEntropyBackwardParams& p, DType dtype) {
  dispatch_dtype(dtype, "cross_entropy_backward", [&](auto tag) { backward_rows<host_type_t<decltype(tag)>>(p); });
}

void cross_entropy_cpu(const CrossEntropyParams& p, DType dtype) {
  dispatch_dtype(dtype, "cross_entropy", [&](auto tag) { rows<host_type_t<decltype(tag)>>(p); });
}

}  // namespace llmk::detail
