// torch.ops.llmk attention ops: attention and attention_varlen (forward; FlashAttention 2's
// algorithm). Schemas, fakes and autograd: python/llmk/ops/attention.py.
#include <cmath>

#include "torch_bridge.h"

namespace llmk::torch_ops {
namespace {

double scale_or_default(std::optional<double> scale, const Tensor& q) {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.dim() ? q.size(-1) : 1));
}

// lse: float32 [batch, heads_q, seq_q] of q [batch, seq_q, heads_q, head_dim] (varlen q
// [total_q, heads_q, head_dim]: [heads_q, total_q]); empty ([0]) when not wanted.
Tensor lse_for(const Tensor& q, bool want) {
  Shape shape{0};
  if (want && q.dim() == 4) shape = {q.size(0), q.size(2), q.size(1)};
  if (want && q.dim() == 3) shape = {q.size(1), q.size(0)};
  return empty(q, shape, ScalarType::Float);
}

std::tuple<Tensor, Tensor> attention(Tensor q, Tensor k, Tensor v, bool causal, std::optional<double> scale,
                                     bool return_lse) {
  const OpCall op("attention", q);
  Tensor out = output_like(q);
  Tensor lse = lse_for(q, return_lse);
  llmk::attention(op.view(out, "out"), op.view(q, "q"), op.view(k, "k"), op.view(v, "v"), causal,
                  scale_or_default(scale, q), op.view_if(return_lse, lse, "lse"), op.stream());
  return {out, lse};
}

std::tuple<Tensor, Tensor> attention_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q,
                                            Tensor cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                                            bool causal, std::optional<double> scale, bool return_lse) {
  const OpCall op("attention_varlen", q);
  Tensor out = output_like(q);
  Tensor lse = lse_for(q, return_lse);
  llmk::attention_varlen(op.view(out, "out"), op.view(q, "q"), op.view(k, "k"), op.view(v, "v"),
                         op.view(cu_seqlens_q, "cu_seqlens_q"), op.view(cu_seqlens_k, "cu_seqlens_k"),
                         max_seqlen_q, max_seqlen_k, causal, scale_or_default(scale, q),
                         op.view_if(return_lse, lse, "lse"), op.stream());
  return {out, lse};
}

void register_attention(torch::stable::detail::StableLibrary& m) {
  m.impl("attention", TORCH_BOX(&attention));
  m.impl("attention_varlen", TORCH_BOX(&attention_varlen));
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(llmk, CPU, m) { register_attention(m); }
STABLE_TORCH_LIBRARY_IMPL(llmk, CUDA, m) { register_attention(m); }

}  // namespace llmk::torch_ops
