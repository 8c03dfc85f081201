// torch.ops.llmk.adamw_step_: one fused AdamW update over lists of tensors (the optimizer
// class is llmk.optim.AdamW). Schema and fake: python/llmk/ops/optim.py.
#include <vector>

#include "torch_bridge.h"

namespace llmk::torch_ops {
namespace {

void adamw_step_(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor> exp_avgs,
                 std::vector<Tensor> exp_avg_sqs, std::vector<Tensor> steps, double lr,
                 std::optional<Tensor> lr_tensor, double beta1, double beta2, double eps, double weight_decay,
                 bool maximize) {
  const size_t n = params.size();
  LLMK_CHECK(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n && steps.size() == n,
             "adamw_step_: params, grads, exp_avgs, exp_avg_sqs and steps must have the same length, got ", n,
             ", ", grads.size(), ", ", exp_avgs.size(), ", ", exp_avg_sqs.size(), ", ", steps.size());
  if (n == 0) return;
  const OpCall op("adamw_step_", params[0]);
  std::vector<AdamWParam> list(n);
  for (size_t i = 0; i < n; ++i)
    list[i] = {op.view(params[i], "params"), op.view(grads[i], "grads"), op.view(exp_avgs[i], "exp_avgs"),
               op.view(exp_avg_sqs[i], "exp_avg_sqs"), op.view(steps[i], "steps")};
  const AdamWOptions options{lr, beta1, beta2, eps, weight_decay, maximize};
  llmk::adamw_step_(list, options, op.view(lr_tensor, "lr_tensor"), op.stream());
}

void register_optim(torch::stable::detail::StableLibrary& m) { m.impl("adamw_step_", TORCH_BOX(&adamw_step_)); }

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(llmk, CPU, m) { register_optim(m); }
STABLE_TORCH_LIBRARY_IMPL(llmk, CUDA, m) { register_optim(m); }

}  // namespace llmk::torch_ops
