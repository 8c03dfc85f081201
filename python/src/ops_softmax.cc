// torch.ops.llmk softmax ops: softmax, log_softmax and their backwards.
// Schemas, fakes and autograd: python/llmk/ops/softmax.py.
#include "torch_bridge.h"

namespace llmk::torch_ops {
namespace {

using Forward = void (*)(const TensorView&, const TensorView&, double, cudaStream_t);
using Backward = void (*)(const TensorView&, const TensorView&, const TensorView&, double, cudaStream_t);

template <const char* kName, Forward kFn>
Tensor forward(Tensor x, double scale) {
  const OpCall op(kName, x);
  Tensor out = output_like(x);
  kFn(op.view(out, "out"), op.view(x, "x"), scale, op.stream());
  return out;
}

template <const char* kName, Backward kFn>
Tensor backward(Tensor dy, Tensor y, double scale) {
  const OpCall op(kName, y);
  dy = dense_rows(dy);
  Tensor dx = output_like(y);
  kFn(op.view(dx, "dx"), op.view(dy, "dy"), op.view(y, "y"), scale, op.stream());
  return dx;
}

constexpr char kSoftmax[] = "softmax";
constexpr char kLogSoftmax[] = "log_softmax";
constexpr char kSoftmaxBackward[] = "softmax_backward";
constexpr char kLogSoftmaxBackward[] = "log_softmax_backward";

void register_softmax(torch::stable::detail::StableLibrary& m) {
  m.impl("softmax", TORCH_BOX((&forward<kSoftmax, llmk::softmax>)));
  m.impl("log_softmax", TORCH_BOX((&forward<kLogSoftmax, llmk::log_softmax>)));
  m.impl("softmax_backward", TORCH_BOX((&backward<kSoftmaxBackward, llmk::softmax_backward>)));
  m.impl("log_softmax_backward", TORCH_BOX((&backward<kLogSoftmaxBackward, llmk::log_softmax_backward>)));
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(llmk, CPU, m) { register_softmax(m); }
STABLE_TORCH_LIBRARY_IMPL(llmk, CUDA, m) { register_softmax(m); }

}  // namespace llmk::torch_ops
