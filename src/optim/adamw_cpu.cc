// CPU reference of AdamW: double math from the stored values, one rounding per stored
// value. The oracle of the GPU tests and the host backend.
#include <cmath>

#include "common/host_types.h"
#include "optim/adamw_params.h"

namespace llmk::detail {

namespace {

template <class T>
void update_tensor(const AdamWLaunch& L, int t) {
  const AdamWHyper& h = L.hyper;
  const double lr = h.lr_ptr ? *h.lr_ptr : h.lr;
  const double step = *L.step[t];
  const double step_size = lr / (1.0 - std::pow(h.beta1, step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(h.beta2, step));
  T* param = static_cast<T*>(L.param[t]);
  const T* grad = static_cast<const T*>(L.grad[t]);
  for (int64_t i = 0; i < L.numel[t]; ++i) {
    const double g = (h.maximize ? -1.0 : 1.0) * to_float(grad[i]);
    double p = to_float(param[i]) * (1.0 - lr * h.weight_decay);
    const double m = h.beta1 * L.exp_avg[t][i] + (1.0 - h.beta1) * g;
    const double v = h.beta2 * L.exp_avg_sq[t][i] + (1.0 - h.beta2) * g * g;
    p -= step_size * m / (std::sqrt(v) / bc2_sqrt + h.eps);
    param[i] = from_float<T>(static_cast<float>(p));
    L.exp_avg[t][i] = static_cast<float>(m);
    L.exp_avg_sq[t][i] = static_cast<float>(v);
  }
}

}  // namespace

void adamw_cpu(const AdamWLaunch& launch, DType dtype) {
  dispatch_dtype(dtype, "adamw_step_", [&](auto tag) {
    for (int t = 0; t < launch.count; ++t) update_tensor<host_type_t<decltype(tag)>>(launch, t);
  });
}

}  // namespace llmk::detail
