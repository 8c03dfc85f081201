// torch.ops.llmk attention ops: attention and attention_varlen (FlashAttention 2's algorithm)
// and their backwards, attention_backward and attention_varlen_backward. Schemas, fakes and
// autograd: python/llmk/ops/attention.py.
#include <torch/csrc/stable/ops.h>

#include <cmath>
#include <cstdint>

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

// `deterministic` is the backward's (autograd saves it); the forward is deterministic.
std::tuple<Tensor, Tensor> attention(Tensor q, Tensor k, Tensor v, bool causal, std::optional<double> scale,
                                     bool return_lse, bool /*deterministic*/, std::optional<int64_t> window,
                                     std::optional<double> softcap, std::optional<Tensor> sinks) {
  const OpCall op("attention", q);
  Tensor out = output_like(q);
  Tensor lse = lse_for(q, return_lse);
  llmk::attention(op.view(out, "out"), op.view(q, "q"), op.view(k, "k"), op.view(v, "v"), causal,
                  scale_or_default(scale, q), AttentionOptions{window, softcap, op.view(sinks, "sinks")},
                  op.view_if(return_lse, lse, "lse"), op.stream());
  return {out, lse};
}

std::tuple<Tensor, Tensor> attention_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q,
                                            Tensor cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                                            bool causal, std::optional<double> scale, bool return_lse,
                                            bool /*deterministic*/, std::optional<int64_t> window,
                                            std::optional<double> softcap, std::optional<Tensor> sinks) {
  const OpCall op("attention_varlen", q);
  Tensor out = output_like(q);
  Tensor lse = lse_for(q, return_lse);
  llmk::attention_varlen(op.view(out, "out"), op.view(q, "q"), op.view(k, "k"), op.view(v, "v"),
                         op.view(cu_seqlens_q, "cu_seqlens_q"), op.view(cu_seqlens_k, "cu_seqlens_k"),
                         max_seqlen_q, max_seqlen_k, causal, scale_or_default(scale, q),
                         AttentionOptions{window, softcap, op.view(sinks, "sinks")}, op.view_if(return_lse, lse, "lse"),
                         op.stream());
  return {out, lse};
}

// An upstream gradient as the kernels take it: the head dim contiguous, the other strides
// whole 16-byte rows, the data 16-byte aligned; anything else (sum()'s expanded gradient
// keeps stride 0 and passes) becomes a contiguous copy.
Tensor attention_rows(const Tensor& t) {
  bool ok = t.dim() > 0 && t.stride(-1) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int64_t i = 0; ok && i + 1 < t.dim(); ++i) ok = t.size(i) == 1 || t.stride(i) % 8 == 0;
  return ok ? t : torch::stable::contiguous(t);
}

// dq, dk, dv (contiguous, like q, k, v) and, on the GPU, the float32 workspace for q's
// `q_rows` rows (0 for a q of the wrong rank, which the C++ API then rejects by name).
struct Gradients {
  Tensor dq, dk, dv, workspace;
  Gradients(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_rows)
      : dq(output_like(q)), dk(output_like(k)), dv(output_like(v)),
        workspace(empty(q, {q.is_cuda() && q_rows > 0 ? llmk::attention_backward_workspace_size(
                                                            q_rows, q.size(-2), q.size(-1))
                                                      : 0},
                        ScalarType::Float)) {}
};

// The sinks' gradient is computed by the autograd formula in python/llmk/ops/attention.py
// (one reduction over lse and rowsum(dout * out)); these ops return dq, dk, dv.
std::tuple<Tensor, Tensor, Tensor> attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                                                      Tensor lse, bool causal, std::optional<double> scale,
                                                      bool deterministic, std::optional<int64_t> window,
                                                      std::optional<double> softcap, std::optional<Tensor> sinks) {
  const OpCall op("attention_backward", q);
  dout = attention_rows(dout);
  Gradients g(q, k, v, q.dim() == 4 ? q.size(0) * q.size(1) : 0);
  llmk::attention_backward(op.view(g.dq, "dq"), op.view(g.dk, "dk"), op.view(g.dv, "dv"), op.view(dout, "dout"),
                           op.view(q, "q"), op.view(k, "k"), op.view(v, "v"), op.view(out, "out"),
                           op.view(lse, "lse"), causal, scale_or_default(scale, q),
                           AttentionOptions{window, softcap, op.view(sinks, "sinks")}, std::nullopt, deterministic,
                           op.view_if(q.is_cuda(), g.workspace, "workspace"), op.stream());
  return {g.dq, g.dk, g.dv};
}

std::tuple<Tensor, Tensor, Tensor> attention_varlen_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                                                             Tensor lse, Tensor cu_seqlens_q, Tensor cu_seqlens_k,
                                                             int64_t max_seqlen_q, int64_t max_seqlen_k, bool causal,
                                                             std::optional<double> scale, bool deterministic,
                                                             std::optional<int64_t> window,
                                                             std::optional<double> softcap,
                                                             std::optional<Tensor> sinks) {
  const OpCall op("attention_varlen_backward", q);
  dout = attention_rows(dout);
  Gradients g(q, k, v, q.dim() == 3 ? q.size(0) : 0);
  llmk::attention_varlen_backward(
      op.view(g.dq, "dq"), op.view(g.dk, "dk"), op.view(g.dv, "dv"), op.view(dout, "dout"), op.view(q, "q"),
      op.view(k, "k"), op.view(v, "v"), op.view(out, "out"), op.view(lse, "lse"),
      op.view(cu_seqlens_q, "cu_seqlens_q"), op.view(cu_seqlens_k, "cu_seqlens_k"), max_seqlen_q, max_seqlen_k,
      causal, scale_or_default(scale, q), AttentionOptions{window, softcap, op.view(sinks, "sinks")}, std::nullopt,
      deterministic, op.view_if(q.is_cuda(), g.workspace, "workspace"), op.stream());
  return {g.dq, g.dk, g.dv};
}

void register_attention(torch::stable::detail::StableLibrary& m) {
  m.impl("attention", TORCH_BOX(&attention));
  m.impl("attention_varlen", TORCH_BOX(&attention_varlen));
  m.impl("attention_backward", TORCH_BOX(&attention_backward));
  m.impl("attention_varlen_backward", TORCH_BOX(&attention_varlen_backward));
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(llmk, CPU, m) { register_attention(m); }
STABLE_TORCH_LIBRARY_IMPL(llmk, CUDA, m) { register_attention(m); }

}  // namespace llmk::torch_ops
