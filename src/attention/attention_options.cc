// Validation of the attention score variants (common/attention_options.h), shared by the
// prefill (attention_api.cc) and decode (decode/decode_api.cc) entry points.
#include "common/attention_options.h"

#include <climits>
#include <cmath>

#include "common/rows.h"

namespace llmk::detail {

AttentionVariants check_attention_options(const char* op, const AttentionOptions& o, const TensorView& q,
                                          bool causal) {
  AttentionVariants v;
  if (o.window) {
    LLMK_CHECK(*o.window >= 1, op, ": window must be >= 1 (the keys a query row sees, its own included), got ",
               *o.window);
    LLMK_CHECK(causal, op, ": window needs causal=true (a sliding window bounds the causal mask on the left)");
    // (any window >= seq_k is the causal mask: INT_MAX / 2 keeps the kernels' index math in int)
    v.window = static_cast<int>(*o.window < INT_MAX / 2 ? *o.window : INT_MAX / 2);
  }
  if (o.softcap) {
    LLMK_CHECK(std::isfinite(*o.softcap) && *o.softcap > 0, op,
               ": softcap must be finite and > 0 (leave it unset for none), got ", *o.softcap);
    v.softcap = static_cast<float>(*o.softcap);
    LLMK_CHECK(v.softcap > 0 && std::isfinite(v.softcap), op, ": softcap ", *o.softcap, " is out of float range");
  }
  if (o.sinks) v.sinks = check_head_vector(op, "sinks", *o.sinks, q);
  return v;
}

float* check_head_vector(const char* op, const char* arg, const TensorView& t, const TensorView& q) {
  check_same_device(op, arg, t, "q", q);
  check_dtype(op, arg, t, DType::f32);
  LLMK_CHECK(t.ndim() == 1 && t.size(0) == q.size(-2), op, ": ", arg, " must be float32 [heads_q] = [", q.size(-2),
             "], got ", shape_string(t));
  LLMK_CHECK(t.numel() <= 1 || t.stride(0) == 1, op, ": ", arg, " must be contiguous, got stride ", t.stride(0));
  LLMK_CHECK(is_aligned(t.data(), 4), op, ": ", arg, " data pointer ", t.data(), " is not 4-byte aligned");
  return static_cast<float*>(t.data());
}

}  // namespace llmk::detail
