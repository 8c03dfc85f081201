// torch.ops.llmk gemm ops: linear (act(x · weightᵀ + bias) + residual, nn.Linear's layout,
// one launch with the epilogue fused) and rmsnorm_linear (rmsnorm then a projection, one
// launch for decode). Schemas, fakes and autograd: python/llmk/ops/gemm.py; the C++ API and
// its layout rules (K-contiguous or transposed operands, 16-byte aligned rows):
// include/llmk/gemm.h.
#include <string>

#include "torch_bridge.h"

namespace llmk::torch_ops {
namespace {

// The leading dims of x with `n` columns: x [..., K] -> [..., n] (a 2-d transposed view
// [M, K] -> [M, n] alike). The ranks are checked here, before anything is allocated, so that
// a malformed call names its argument instead of failing in size().
Tensor empty_rows(const OpCall& op, const Tensor& x, int64_t n) {
  LLMK_CHECK(x.dim() >= 1, op.name(), ": x is a 0-d tensor; expected [..., K]");
  Shape shape = shape_of(x);
  shape.back() = n;
  return empty(x, shape, x.scalar_type());
}

int64_t weight_rows(const OpCall& op, const Tensor& weight) {
  LLMK_CHECK(weight.dim() == 2, op.name(), ": weight has ", weight.dim(), " dims; expected [N, K]");
  return weight.size(0);
}

Tensor linear(Tensor x, Tensor weight, std::optional<Tensor> bias, std::optional<Tensor> residual,
              std::string activation) {
  const OpCall op("linear", x);
  GemmEpilogue epilogue;
  epilogue.activation = gemm_activation(op, activation);
  const int64_t n = weight_rows(op, weight);
  LLMK_CHECK(epilogue.activation != GemmActivation::silu_mul || n % 2 == 0, op.name(),
             ": activation 'silu_mul' needs an even number of weight rows (gate then up), got ", n);
  const TensorView a = op.view(x, "x"), b = op.view(weight, "weight");
  epilogue.bias = op.view(bias, "bias");
  epilogue.residual = op.view(residual, "residual");
  Tensor out = empty_rows(op, x, epilogue.activation == GemmActivation::silu_mul ? gated_width(n) : n);
  try {
    llmk::gemm(op.view(out, "out"), a, b, epilogue, op.stream());
  } catch (const CudaError&) {
    throw;
  } catch (const Error& e) {  // the C++ API's names are gemm's: say which of linear's arguments they are
    detail::throw_error("linear: ", e.what(), " (linear's x is gemm's a, its weight is b)");
  }
  return out;
}

Tensor rmsnorm_linear(Tensor x, Tensor norm_weight, Tensor weight, double eps) {
  const OpCall op("rmsnorm_linear", x);
  const TensorView xv = op.view(x, "x"), g = op.view(norm_weight, "norm_weight"), w = op.view(weight, "weight");
  Tensor out = empty_rows(op, x, weight_rows(op, weight));
  llmk::rmsnorm_linear(op.view(out, "out"), xv, g, w, eps, op.stream());
  return out;
}

void register_gemm(torch::stable::detail::StableLibrary& m) {
  m.impl("linear", TORCH_BOX(&linear));
  m.impl("rmsnorm_linear", TORCH_BOX(&rmsnorm_linear));
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(llmk, CPU, m) { register_gemm(m); }
STABLE_TORCH_LIBRARY_IMPL(llmk, CUDA, m) { register_gemm(m); }

}  // namespace llmk::torch_ops
