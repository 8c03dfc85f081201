// torch.ops.llmk decode attention: attention_decode over a contiguous or paged KV cache,
// appending k_new / v_new into the cache first (rotated with RoPE when asked) when they are
// given. The split-KV workspace is allocated here through torch's allocator (the CUDA
// caching allocator: a captured CUDA graph keeps it in its pool), sized by
// attention_decode_workspace_size. Schema and fake: python/llmk/ops/decode.py; the layouts
// and the caller's contract: include/llmk/attention_decode.h.
#include <cmath>

#include "llmk/attention_decode.h"
#include "torch_bridge.h"

namespace llmk::torch_ops {
namespace {

std::tuple<Tensor, Tensor> attention_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens,
                                            std::optional<Tensor> block_table, std::optional<Tensor> k_new,
                                            std::optional<Tensor> v_new, std::optional<Tensor> rotary_cos_sin,
                                            bool rotary_interleaved, bool causal, std::optional<double> scale,
                                            bool return_lse, std::optional<Tensor> k_scale,
                                            std::optional<Tensor> v_scale, std::optional<int64_t> window,
                                            std::optional<double> softcap, std::optional<Tensor> sinks) {
  const OpCall op("attention_decode", q);
  LLMK_CHECK(k_new.has_value() == v_new.has_value(), op.name(), ": k_new and v_new are appended together; got ",
             k_new ? "k_new without v_new" : "v_new without k_new");
  LLMK_CHECK(!rotary_cos_sin || k_new, op.name(), ": rotary_cos_sin rotates q and the appended k_new at positions "
             "cache_seqlens + i; it needs k_new and v_new (rotate a cache written otherwise with rope_)");
  const TensorView qv = op.view(q, "q");
  const DecodeCache cache{op.view(k_cache, "k_cache"), op.view(v_cache, "v_cache"), op.view(block_table, "block_table"),
                          op.view(k_scale, "k_scale"), op.view(v_scale, "v_scale")};
  std::optional<DecodeAppend> append;
  if (k_new) {
    append = DecodeAppend{op.view(*k_new, "k_new"), op.view(*v_new, "v_new"), op.view(rotary_cos_sin, "rotary_cos_sin"),
                          rotary_interleaved ? RopeStyle::gptj : RopeStyle::neox};
  }
  // Checks q and the cache (the error names the argument) before anything is allocated.
  const int64_t workspace_size = attention_decode_workspace_size(qv, cache, q.is_cuda() ? q.get_device_index() : 0);
  Tensor out = output_like(q);
  Tensor lse = empty(q, return_lse ? Shape{q.size(0), q.size(2), q.size(1)} : Shape{0}, ScalarType::Float);
  Tensor workspace = empty(q, {workspace_size}, ScalarType::Float);
  const double s = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  llmk::attention_decode(op.view(out, "out"), qv, cache, op.view(cache_seqlens, "cache_seqlens"), append, causal, s,
                         AttentionOptions{window, softcap, op.view(sinks, "sinks")},
                         op.view_if(return_lse, lse, "lse"),
                         op.view_if(workspace_size > 0, workspace, "workspace"), op.stream());
  return {out, lse};
}

void register_decode(torch::stable::detail::StableLibrary& m) { m.impl("attention_decode", TORCH_BOX(&attention_decode)); }

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(llmk, CPU, m) { register_decode(m); }
STABLE_TORCH_LIBRARY_IMPL(llmk, CUDA, m) { register_decode(m); }

}  // namespace llmk::torch_ops
