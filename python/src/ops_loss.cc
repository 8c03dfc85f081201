// torch.ops.llmk loss ops: cross_entropy (per-row loss and lse), cross_entropy_grad_ (the same
// with the logits' gradient written over the logits in that pass) and cross_entropy_backward
// (the logits' gradient from the upstream per-row gradient and the forward's lse, one pass).
// Schemas, fakes and autograd: python/llmk/ops/loss.py.
#include "torch_bridge.h"

namespace llmk::torch_ops {
namespace {

std::tuple<Tensor, Tensor> cross_entropy(Tensor logits, Tensor target, int64_t ignore_index, double label_smoothing,
                                         double z_loss) {
  const OpCall op("cross_entropy", logits);
  Tensor loss = empty(logits, rows_shape(logits), ScalarType::Float);
  Tensor lse = empty(logits, rows_shape(logits), ScalarType::Float);
  llmk::cross_entropy(op.view(loss, "loss"), op.view(lse, "lse"), op.view(logits, "logits"), op.view(target, "target"),
                      ignore_index, label_smoothing, z_loss, 1.0, std::nullopt, op.stream());
  return {loss, lse};
}

// grad_scale 1: the gradient of the sum of the rows' losses; the caller scales it for its reduction.
std::tuple<Tensor, Tensor> cross_entropy_grad_(Tensor logits, Tensor target, int64_t ignore_index,
                                               double label_smoothing, double z_loss) {
  const OpCall op("cross_entropy_grad_", logits);
  Tensor loss = empty(logits, rows_shape(logits), ScalarType::Float);
  Tensor lse = empty(logits, rows_shape(logits), ScalarType::Float);
  const TensorView z = op.view(logits, "logits");
  llmk::cross_entropy(op.view(loss, "loss"), op.view(lse, "lse"), z, op.view(target, "target"), ignore_index,
                      label_smoothing, z_loss, 1.0, z, op.stream());
  return {loss, lse};
}

Tensor cross_entropy_backward(Tensor dloss, Tensor logits, Tensor target, Tensor lse, int64_t ignore_index,
                              double label_smoothing, double z_loss) {
  const OpCall op("cross_entropy_backward", logits);
  Tensor dlogits = output_like(logits);
  llmk::cross_entropy_backward(op.view(dlogits, "dlogits"), op.view(dense_rows(dloss), "dloss"),
                               op.view(logits, "logits"), op.view(target, "target"), op.view(lse, "lse"),
                               ignore_index, label_smoothing, z_loss, op.stream());
  return dlogits;
}

void register_loss(torch::stable::detail::StableLibrary& m) {
  m.impl("cross_entropy", TORCH_BOX(&cross_entropy));
  m.impl("cross_entropy_grad_", TORCH_BOX(&cross_entropy_grad_));
  m.impl("cross_entropy_backward", TORCH_BOX(&cross_entropy_backward));
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(llmk, CPU, m) { register_loss(m); }
STABLE_TORCH_LIBRARY_IMPL(llmk, CUDA, m) { register_loss(m); }

}  // namespace llmk::torch_ops
