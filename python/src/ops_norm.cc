// torch.ops.llmk normalization ops: rmsnorm, rmsnorm_with_rstd, add_rmsnorm, add_rmsnorm_,
// rmsnorm_backward, rmsnorm_swiglu, rmsnorm_swiglu_backward, layernorm, layernorm_with_stats,
// layernorm_backward.
// Schemas, fakes and autograd: python/llmk/ops/norm.py.
#include <torch/csrc/stable/ops.h>

#include "torch_bridge.h"

namespace llmk::torch_ops {
namespace {

Tensor rmsnorm(Tensor x, Tensor weight, double eps, double offset) {
  const OpCall op("rmsnorm", x);
  Tensor out = output_like(x);
  llmk::rmsnorm(op.view(out, "out"), op.view(x, "x"), op.view(weight, "weight"), eps, offset, std::nullopt,
                op.stream());
  return out;
}

std::tuple<Tensor, Tensor> rmsnorm_with_rstd(Tensor x, Tensor weight, double eps, double offset) {
  const OpCall op("rmsnorm", x);
  Tensor out = output_like(x);
  Tensor rstd = empty(x, rows_shape(x), ScalarType::Float);
  llmk::rmsnorm(op.view(out, "out"), op.view(x, "x"), op.view(weight, "weight"), eps, offset,
                op.view(torch::stable::flatten(rstd), "rstd"), op.stream());
  return {out, rstd};
}

std::tuple<Tensor, Tensor> add_rmsnorm(Tensor x, Tensor residual, Tensor weight, double eps, double offset) {
  const OpCall op("add_rmsnorm", x);
  Tensor out = output_like(x);
  Tensor residual_out = output_like(x);
  llmk::add_rmsnorm(op.view(out, "out"), op.view(residual_out, "residual_out"), op.view(x, "x"),
                    op.view(residual, "residual"), op.view(weight, "weight"), eps, offset, op.stream());
  return {out, residual_out};
}

void add_rmsnorm_(Tensor x, Tensor residual, Tensor weight, double eps, double offset) {
  const OpCall op("add_rmsnorm_", x);
  llmk::add_rmsnorm_(op.view(x, "x"), op.view(residual, "residual"), op.view(weight, "weight"), eps, offset,
                     op.stream());
}

std::tuple<Tensor, Tensor> rmsnorm_backward(Tensor dy, Tensor x, Tensor weight, double eps, double offset,
                                            std::optional<Tensor> dresidual) {
  const OpCall op("rmsnorm_backward", x);
  dy = dense_rows(dy);
  if (dresidual) dresidual = dense_rows(*dresidual);
  Tensor dx = output_like(x);
  Tensor dweight = output_like(weight);
  Tensor workspace = row_workspace(x, llmk::rmsnorm_backward_workspace_size);
  llmk::rmsnorm_backward(op.view(dx, "dx"), op.view(dweight, "dweight"), op.view(dy, "dy"), op.view(x, "x"),
                         op.view(weight, "weight"), eps, offset, op.view(dresidual, "dresidual"),
                         op.view(workspace, "workspace"), op.stream());
  return {dx, dweight};
}

Tensor rmsnorm_swiglu(Tensor x, Tensor gate, Tensor weight, double eps, double offset) {
  const OpCall op("rmsnorm_swiglu", x);
  Tensor out = output_like(x);
  llmk::rmsnorm_swiglu(op.view(out, "out"), op.view(x, "x"), op.view(gate, "gate"), op.view(weight, "weight"),
                       eps, offset, std::nullopt, op.stream());
  return out;
}

std::tuple<Tensor, Tensor, Tensor> rmsnorm_swiglu_backward(Tensor dy, Tensor x, Tensor gate, Tensor weight,
                                                           double eps, double offset) {
  const OpCall op("rmsnorm_swiglu_backward", x);
  dy = dense_rows(dy);
  Tensor dx = output_like(x);
  Tensor dgate = output_like(x);
  Tensor dweight = output_like(weight);
  Tensor workspace = row_workspace(x, llmk::rmsnorm_backward_workspace_size);
  llmk::rmsnorm_swiglu_backward(op.view(dx, "dx"), op.view(dgate, "dgate"), op.view(dweight, "dweight"),
                                op.view(dy, "dy"), op.view(x, "x"), op.view(gate, "gate"),
                                op.view(weight, "weight"), eps, offset, op.view(workspace, "workspace"),
                                op.stream());
  return {dx, dgate, dweight};
}

Tensor layernorm(Tensor x, std::optional<Tensor> weight, std::optional<Tensor> bias, double eps) {
  const OpCall op("layernorm", x);
  Tensor out = output_like(x);
  llmk::layernorm(op.view(out, "out"), op.view(x, "x"), op.view(weight, "weight"), op.view(bias, "bias"), eps,
                  std::nullopt, std::nullopt, op.stream());
  return out;
}

// The forward with each row's mean and rstd (f32, x's shape without its last dim): what
// autograd saves for layernorm_backward.
std::tuple<Tensor, Tensor, Tensor> layernorm_with_stats(Tensor x, std::optional<Tensor> weight,
                                                        std::optional<Tensor> bias, double eps) {
  const OpCall op("layernorm", x);
  Tensor out = output_like(x);
  Tensor mean = empty(x, rows_shape(x), ScalarType::Float);
  Tensor rstd = empty(x, rows_shape(x), ScalarType::Float);
  llmk::layernorm(op.view(out, "out"), op.view(x, "x"), op.view(weight, "weight"), op.view(bias, "bias"), eps,
                  op.view(torch::stable::flatten(mean), "mean"), op.view(torch::stable::flatten(rstd), "rstd"),
                  op.stream());
  return {out, mean, rstd};
}

// dweight and dbias are empty ([0]) when there is no weight / no dbias is wanted. mean and
// rstd: the forward's statistics (both or neither), flattened to [rows].
std::tuple<Tensor, Tensor, Tensor> layernorm_backward(Tensor dy, Tensor x, std::optional<Tensor> weight,
                                                      double eps, bool want_dbias, std::optional<Tensor> mean,
                                                      std::optional<Tensor> rstd) {
  const OpCall op("layernorm_backward", x);
  dy = dense_rows(dy);
  const ScalarType param_dtype = weight ? weight->scalar_type() : x.scalar_type();
  const int64_t d = x.dim() ? x.size(-1) : 1;
  Tensor dx = output_like(x);
  Tensor dweight = empty(x, {weight ? d : 0}, param_dtype);
  Tensor dbias = empty(x, {want_dbias ? d : 0}, param_dtype);
  Tensor workspace = row_workspace(x, llmk::layernorm_backward_workspace_size);
  if (mean) mean = torch::stable::flatten(*mean);
  if (rstd) rstd = torch::stable::flatten(*rstd);
  llmk::layernorm_backward(op.view(dx, "dx"), op.view_if(weight.has_value(), dweight, "dweight"),
                           op.view_if(want_dbias, dbias, "dbias"), op.view(dy, "dy"),
                           op.view(x, "x"), op.view(weight, "weight"), eps, op.view(mean, "mean"),
                           op.view(rstd, "rstd"), op.view(workspace, "workspace"), op.stream());
  return {dx, dweight, dbias};
}

void register_norm(torch::stable::detail::StableLibrary& m) {
  m.impl("rmsnorm", TORCH_BOX(&rmsnorm));
  m.impl("rmsnorm_with_rstd", TORCH_BOX(&rmsnorm_with_rstd));
  m.impl("add_rmsnorm", TORCH_BOX(&add_rmsnorm));
  m.impl("add_rmsnorm_", TORCH_BOX(&add_rmsnorm_));
  m.impl("rmsnorm_backward", TORCH_BOX(&rmsnorm_backward));
  m.impl("rmsnorm_swiglu", TORCH_BOX(&rmsnorm_swiglu));
  m.impl("rmsnorm_swiglu_backward", TORCH_BOX(&rmsnorm_swiglu_backward));
  m.impl("layernorm", TORCH_BOX(&layernorm));
  m.impl("layernorm_with_stats", TORCH_BOX(&layernorm_with_stats));
  m.impl("layernorm_backward", TORCH_BOX(&layernorm_backward));
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(llmk, CPU, m) { register_norm(m); }
STABLE_TORCH_LIBRARY_IMPL(llmk, CUDA, m) { register_norm(m); }

}  // namespace llmk::torch_ops
