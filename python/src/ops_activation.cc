// torch.ops.llmk activation ops: silu_and_mul, gelu_and_mul, swiglu, geglu, their
// backwards, bias_gelu and bias_gelu_backward. Schemas, fakes and autograd:
// python/llmk/ops/activation.py.
#include <string>

#include "torch_bridge.h"

namespace llmk::torch_ops {
namespace {

// [..., 2d] -> [..., d]: the output of a gated activation over a fused gate-and-up tensor.
Tensor empty_half(const Tensor& x) {
  Shape shape = shape_of(x);
  if (!shape.empty()) shape.back() = gated_width(shape.back());
  return empty(x, shape, x.scalar_type());
}

Tensor silu_and_mul(Tensor x) {
  const OpCall op("silu_and_mul", x);
  Tensor out = empty_half(x);
  llmk::silu_and_mul(op.view(out, "out"), op.view(x, "x"), op.stream());
  return out;
}

Tensor gelu_and_mul(Tensor x, std::string approximate) {
  const OpCall op("gelu_and_mul", x);
  const GeluApproximation a = gelu_approximation(op, approximate);
  Tensor out = empty_half(x);
  llmk::gelu_and_mul(op.view(out, "out"), op.view(x, "x"), a, op.stream());
  return out;
}

// The two-tensor form (swiglu, geglu): out like gate; `run(out, gate, up)` calls the C++ op.
template <class Run>
Tensor two_tensor(const OpCall& op, const Tensor& gate, const Tensor& up, Run&& run) {
  Tensor out = output_like(gate);
  run(op.view(out, "out"), op.view(gate, "gate"), op.view(up, "up"));
  return out;
}

Tensor swiglu(Tensor gate, Tensor up) {
  const OpCall op("swiglu", gate);
  return two_tensor(op, gate, up, [&](auto... v) { llmk::swiglu(v..., op.stream()); });
}

Tensor geglu(Tensor gate, Tensor up, std::string approximate) {
  const OpCall op("geglu", gate);
  const GeluApproximation a = gelu_approximation(op, approximate);
  return two_tensor(op, gate, up, [&](auto... v) { llmk::geglu(v..., a, op.stream()); });
}

Tensor silu_and_mul_backward(Tensor dy, Tensor x) {
  const OpCall op("silu_and_mul_backward", x);
  dy = dense_rows(dy);
  Tensor dx = output_like(x);
  llmk::silu_and_mul_backward(op.view(dx, "dx"), op.view(dy, "dy"), op.view(x, "x"), op.stream());
  return dx;
}

Tensor gelu_and_mul_backward(Tensor dy, Tensor x, std::string approximate) {
  const OpCall op("gelu_and_mul_backward", x);
  const GeluApproximation a = gelu_approximation(op, approximate);
  dy = dense_rows(dy);
  Tensor dx = output_like(x);
  llmk::gelu_and_mul_backward(op.view(dx, "dx"), op.view(dy, "dy"), op.view(x, "x"), a, op.stream());
  return dx;
}

// (dgate, dup) like (gate, up); `run(dgate, dup, dy, gate, up)` calls the C++ op.
template <class Run>
std::tuple<Tensor, Tensor> two_tensor_backward(const OpCall& op, Tensor dy, const Tensor& gate, const Tensor& up,
                                               Run&& run) {
  dy = dense_rows(dy);
  Tensor dgate = output_like(gate);
  Tensor dup = output_like(up);
  run(op.view(dgate, "dgate"), op.view(dup, "dup"), op.view(dy, "dy"), op.view(gate, "gate"), op.view(up, "up"));
  return {dgate, dup};
}

std::tuple<Tensor, Tensor> swiglu_backward(Tensor dy, Tensor gate, Tensor up) {
  const OpCall op("swiglu_backward", gate);
  return two_tensor_backward(op, dy, gate, up, [&](auto... v) { llmk::swiglu_backward(v..., op.stream()); });
}

std::tuple<Tensor, Tensor> geglu_backward(Tensor dy, Tensor gate, Tensor up, std::string approximate) {
  const OpCall op("geglu_backward", gate);
  const GeluApproximation a = gelu_approximation(op, approximate);
  return two_tensor_backward(op, dy, gate, up, [&](auto... v) { llmk::geglu_backward(v..., a, op.stream()); });
}

Tensor bias_gelu(Tensor x, Tensor bias, std::string approximate) {
  const OpCall op("bias_gelu", x);
  const GeluApproximation a = gelu_approximation(op, approximate);
  Tensor out = output_like(x);
  llmk::bias_gelu(op.view(out, "out"), op.view(x, "x"), op.view(bias, "bias"), a, op.stream());
  return out;
}

std::tuple<Tensor, Tensor> bias_gelu_backward(Tensor dy, Tensor x, Tensor bias, std::string approximate) {
  const OpCall op("bias_gelu_backward", x);
  const GeluApproximation a = gelu_approximation(op, approximate);
  dy = dense_rows(dy);
  Tensor dx = output_like(x);
  Tensor dbias = output_like(bias);
  Tensor workspace = row_workspace(x, llmk::bias_gelu_backward_workspace_size);
  llmk::bias_gelu_backward(op.view(dx, "dx"), op.view(dbias, "dbias"), op.view(dy, "dy"), op.view(x, "x"),
                           op.view(bias, "bias"), a, op.view(workspace, "workspace"), op.stream());
  return {dx, dbias};
}

void register_activation(torch::stable::detail::StableLibrary& m) {
  m.impl("silu_and_mul", TORCH_BOX(&silu_and_mul));
  m.impl("gelu_and_mul", TORCH_BOX(&gelu_and_mul));
  m.impl("swiglu", TORCH_BOX(&swiglu));
  m.impl("geglu", TORCH_BOX(&geglu));
  m.impl("silu_and_mul_backward", TORCH_BOX(&silu_and_mul_backward));
  m.impl("gelu_and_mul_backward", TORCH_BOX(&gelu_and_mul_backward));
  m.impl("swiglu_backward", TORCH_BOX(&swiglu_backward));
  m.impl("geglu_backward", TORCH_BOX(&geglu_backward));
  m.impl("bias_gelu", TORCH_BOX(&bias_gelu));
  m.impl("bias_gelu_backward", TORCH_BOX(&bias_gelu_backward));
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(llmk, CPU, m) { register_activation(m); }
STABLE_TORCH_LIBRARY_IMPL(llmk, CUDA, m) { register_activation(m); }

}  // namespace llmk::torch_ops
