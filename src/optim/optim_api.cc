// Public entry point of the fused AdamW step: validate every tensor and hyperparameter (a
// rejected call writes nothing), then group the tensors by dtype into launches of up to
// kAdamWMaxTensors tensors.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/cuda_check.h"
#include "common/rows.h"
#include "llmk/optim.h"
#include "optim/adamw_params.h"

namespace llmk {

using detail::AdamWLaunch;

namespace {

constexpr const char* kOp = "adamw_step_";

void check_scalar(const std::string& arg, const TensorView& t, const TensorView& ref) {
  detail::check_same_device(kOp, arg.c_str(), t, "params[0].param", ref);
  detail::check_dtype(kOp, arg.c_str(), t, DType::f32);
  LLMK_CHECK(t.numel() == 1, kOp, ": ", arg, " must hold one element, got ", t.numel());
  LLMK_CHECK(detail::is_aligned(t.data(), 4), kOp, ": ", arg, " data pointer ", t.data(),
             " is not 4-byte aligned");
}

void check_param(size_t i, const AdamWParam& a, const TensorView& ref) {
  const std::string n = "params[" + std::to_string(i) + "]";
  const std::string param = n + ".param", grad = n + ".grad", m = n + ".exp_avg",
                    v = n + ".exp_avg_sq";
  detail::check_same_device(kOp, param.c_str(), a.param, "params[0].param", ref);
  detail::check_float_dtype(kOp, param.c_str(), a.param);
  detail::check_same_device(kOp, grad.c_str(), a.grad, param.c_str(), a.param);
  detail::check_dtype(kOp, grad.c_str(), a.grad, a.param.dtype());
  detail::check_same_shape(kOp, grad.c_str(), a.grad, param.c_str(), a.param);
  for (const auto& [name, t] : {std::pair{&m, &a.exp_avg}, {&v, &a.exp_avg_sq}}) {
    detail::check_same_device(kOp, name->c_str(), *t, param.c_str(), a.param);
    detail::check_dtype(kOp, name->c_str(), *t, DType::f32);
    detail::check_same_shape(kOp, name->c_str(), *t, param.c_str(), a.param);
  }
  const std::pair<const std::string*, const TensorView*> all[] = {
      {&param, &a.param}, {&grad, &a.grad}, {&m, &a.exp_avg}, {&v, &a.exp_avg_sq}};
  for (const auto& [name, t] : all) {
    LLMK_CHECK(detail::is_contiguous(*t), kOp, ": ", *name, " must be contiguous, got shape ",
               detail::shape_string(*t), " with strides ", detail::dims_string(t->strides(), t->ndim()));
    if (t->numel() > 0) detail::check_element_aligned(kOp, name->c_str(), *t);
  }
  for (int x = 0; x < 4; ++x)
    for (int y = x + 1; y < 4; ++y)
      detail::check_no_overlap(kOp, all[x].first->c_str(), *all[x].second, all[y].first->c_str(),
                               *all[y].second, false);
  check_scalar(n + ".step", a.step, ref);
}

void check_options(const AdamWOptions& o, bool device_lr) {
  LLMK_CHECK(device_lr || (std::isfinite(o.lr) && o.lr >= 0), kOp, ": lr must be finite and >= 0, got ",
             o.lr);
  LLMK_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, kOp,
             ": betas must be in [0, 1), got (", o.beta1, ", ", o.beta2, ")");
  LLMK_CHECK(std::isfinite(o.eps) && o.eps >= 0, kOp, ": eps must be finite and >= 0, got ", o.eps);
  LLMK_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0, kOp,
             ": weight_decay must be finite and >= 0, got ", o.weight_decay);
}

}  // namespace

void adamw_step_(const std::vector<AdamWParam>& params, const AdamWOptions& options,
                 const std::optional<TensorView>& lr_tensor, cudaStream_t stream) {
  if (params.empty()) return;
  const TensorView& ref = params[0].param;
  check_options(options, lr_tensor.has_value());
  if (lr_tensor) check_scalar("lr_tensor", *lr_tensor, ref);
  for (size_t i = 0; i < params.size(); ++i) check_param(i, params[i], ref);
  const bool on_host = !ref.is_cuda();
  if (on_host) {  // the step counts are read on the host: check them too
    for (size_t i = 0; i < params.size(); ++i) {
      const float t = *static_cast<const float*>(params[i].step.data());
      LLMK_CHECK(std::isfinite(t) && t >= 1, kOp, ": params[", i, "].step must be >= 1, got ", t);
    }
  }

  AdamWLaunch launch;
  launch.hyper = {options.lr, options.beta1, options.beta2, options.eps, options.weight_decay,
                  options.maximize, lr_tensor ? static_cast<const float*>(lr_tensor->data()) : nullptr};
  std::optional<detail::DeviceGuard> guard;
  if (!on_host) guard.emplace(kOp, "params[0].param", ref);
  auto flush = [&](DType dtype) {
    if (launch.count == 0) return;
    if (on_host) detail::adamw_cpu(launch, dtype);
    else detail::adamw_cuda(launch, dtype, stream);
    launch.count = 0;
  };
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (const AdamWParam& a : params) {
      if (a.param.dtype() != dtype || a.param.numel() == 0) continue;
      const int64_t chunks = (a.param.numel() + detail::kAdamWChunk - 1) / detail::kAdamWChunk;
      const int64_t before = launch.count ? launch.chunk_end[launch.count - 1] : 0;
      if (launch.count == detail::kAdamWMaxTensors || before + chunks > INT32_MAX) flush(dtype);
      const int c = launch.count++;
      launch.param[c] = a.param.data();
      launch.grad[c] = a.grad.data();
      launch.exp_avg[c] = static_cast<float*>(a.exp_avg.data());
      launch.exp_avg_sq[c] = static_cast<float*>(a.exp_avg_sq.data());
      launch.step[c] = static_cast<const float*>(a.step.data());
      launch.numel[c] = a.param.numel();
      launch.chunk_end[c] = static_cast<int32_t>((c ? launch.chunk_end[c - 1] : 0) + chunks);
      launch.vector_ok[c] = detail::is_aligned(a.param.data(), 16) && detail::is_aligned(a.grad.data(), 16) &&
                            detail::is_aligned(a.exp_avg.data(), 16) &&
                            detail::is_aligned(a.exp_avg_sq.data(), 16);
    }
    flush(dtype);
  }
}

}  // namespace llmk
