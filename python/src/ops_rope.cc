// torch.ops.llmk RoPE ops: rope_ and rope_backward_ (in place on q and k, one launch), and
// the functional rope / rope_backward (new contiguous tensors written by the out-of-place
// kernel in one launch; the autograd pair).
// Schemas, fakes and autograd: python/llmk/ops/rope.py.
#include <string>
#include <vector>

#include "torch_bridge.h"

namespace llmk::torch_ops {
namespace {

// Where the angles come from: the arguments every RoPE op takes after its tensors. Each
// argument is honoured or rejected: theta, rot_dim and llama3_scaling describe angles
// computed from theta and cannot be combined with a cos_sin_cache (which holds its own).
struct Angles {
  std::optional<Tensor> cache;
  RopeTheta theta;
  RopeStyle style;
};

Angles angles(const OpCall& op, const std::optional<Tensor>& cache, std::optional<double> theta, int64_t rot_dim,
              const std::string& style, const std::optional<std::vector<double>>& llama3) {
  Angles a{cache, RopeTheta{rot_dim, theta.value_or(10000.0), std::nullopt}, RopeStyle::neox};
  if (style == "gptj") a.style = RopeStyle::gptj;
  else LLMK_CHECK(style == "neox", op.name(), ": style must be 'neox' or 'gptj', got '", style, "'");
  if (cache) {
    const int64_t width = cache->dim() == 2 ? cache->size(1) : -1;
    LLMK_CHECK(rot_dim == 0 || rot_dim == width, op.name(), ": rot_dim ", rot_dim,
               " does not match the ", width, " columns of cos_sin_cache (a cache's width is its rotary "
               "dim: pass rot_dim=None, or a cache of ", rot_dim, " columns)");
    LLMK_CHECK(!theta, op.name(), ": theta (", *theta, ") and cos_sin_cache were both given; the cache holds the "
               "angles, so pass one or the other");
    LLMK_CHECK(!llama3, op.name(), ": llama3_scaling applies to angles computed from theta; a cos_sin_cache "
               "holds its angles already (build it with rope_cos_sin_cache(..., llama3_scaling=...))");
    return a;
  }
  if (llama3) {
    LLMK_CHECK(llama3->size() == 4, op.name(), ": llama3_scaling takes 4 values (factor, low_freq_factor, "
               "high_freq_factor, original_max_position), got ", llama3->size());
    a.theta.llama3 = Llama3RopeScaling{(*llama3)[0], (*llama3)[1], (*llama3)[2], (*llama3)[3]};
  }
  return a;
}

// Calls f with the angle source as the C++ API takes it: the cache's view or the theta
// parameters.
template <class F>
void with_angles(const OpCall& op, const Angles& a, F&& f) {
  if (a.cache) f(op.view(*a.cache, "cos_sin_cache"));
  else f(a.theta);
}

template <bool kBackward>
void in_place(Tensor q, std::optional<Tensor> k, Tensor positions, std::optional<Tensor> cache,
              std::optional<double> theta, int64_t rot_dim, std::string style,
              std::optional<std::vector<double>> llama3) {
  const OpCall op(kBackward ? "rope_backward_" : "rope_", q);
  const Angles a = angles(op, cache, theta, rot_dim, style, llama3);
  const TensorView qv = op.view(q, kBackward ? "dq" : "q"), pv = op.view(positions, "positions");
  const std::optional<TensorView> kv = op.view(k, kBackward ? "dk" : "k");
  with_angles(op, a, [&](const auto& source) {
    if constexpr (kBackward) rope_backward_(qv, kv, pv, source, a.style, op.stream());
    else rope_(qv, kv, pv, source, a.style, op.stream());
  });
}

// New contiguous outputs written by the out-of-place kernel: each element read once and
// written once. k absent: the second output is empty ([0]).
template <bool kBackward>
std::tuple<Tensor, Tensor> functional(Tensor q, std::optional<Tensor> k, Tensor positions,
                                      std::optional<Tensor> cache, std::optional<double> theta, int64_t rot_dim,
                                      std::string style, std::optional<std::vector<double>> llama3) {
  const OpCall op(kBackward ? "rope_backward" : "rope", q);
  const Angles a = angles(op, cache, theta, rot_dim, style, llama3);
  // The kernel reads any strides but a last dim's (gradients may arrive expanded).
  q = dense_rows(q);
  if (k) k = dense_rows(*k);
  const Tensor q_out = output_like(q);
  std::optional<Tensor> k_out;
  if (k) k_out = output_like(*k);
  const TensorView qv = op.view(q, kBackward ? "dq" : "q"), pv = op.view(positions, "positions");
  const TensorView qo = op.view(q_out, kBackward ? "dq_out" : "q_out");
  const std::optional<TensorView> kv = op.view(k, kBackward ? "dk" : "k");
  const std::optional<TensorView> ko = op.view(k_out, kBackward ? "dk_out" : "k_out");
  with_angles(op, a, [&](const auto& source) {
    if constexpr (kBackward) rope_backward(qo, ko, qv, kv, pv, source, a.style, op.stream());
    else rope(qo, ko, qv, kv, pv, source, a.style, op.stream());
  });
  return {q_out, k_out ? *k_out : empty(q, {0}, q.scalar_type())};
}

void register_rope(torch::stable::detail::StableLibrary& m) {
  m.impl("rope_", TORCH_BOX(&in_place<false>));
  m.impl("rope_backward_", TORCH_BOX(&in_place<true>));
  m.impl("rope", TORCH_BOX(&functional<false>));
  m.impl("rope_backward", TORCH_BOX(&functional<true>));
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(llmk, CPU, m) { register_rope(m); }
STABLE_TORCH_LIBRARY_IMPL(llmk, CUDA, m) { register_rope(m); }

}  // namespace llmk::torch_ops
