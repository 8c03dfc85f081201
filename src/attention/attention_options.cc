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
    v.window = static_cast<int>(*o.window < INT_MAX ? *o.window : INT_MAX);
  }
  if (o.softcap) {
    LLMK_CHECK(std::isfinite(*o.softcap) && *o.softcap > 0, op,
               ": softcap must be finite and > 0 (leave it unset for none), got ", *o.softcap);
    v.softcap = static_cast<float>(*o.softcap);
    LLMK_CHECK(v.softcap > 0 && std::isfinite(v.softcap), op, ": softcap ", *o.softcap, " is out of float range");
  }
  if (o.sinks) {
    const TensorView& s = *o.sinks;
    check_same_device(op, "sinks", s, "q", q);
    check_dtype(op, "sinks", s, DType::f32);
    LLMK_CHECK(s.ndim() == 1 && s.size(0) == q.size(-2), op, ": sinks must be float32 [heads_q] = [", q.size(-2),
               "], got ", shape_string(s));
    LLMK_CHECK(s.numel() <= 1 || s.stride(0) == 1, op, ": sinks must be contiguous, got stride ", s.stride(0));
    LLMK_CHECK(is_aligned(s.data(), 4), op, ": sinks data pointer ", s.data(), " is not 4-byte aligned");
    v.sinks = static_cast<const float*>(s.data());
  }
  return v;
}

}  // namespace llmk::detail
