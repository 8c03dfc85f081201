// The score variants of llmk::AttentionOptions (include/llmk/attention.h) as the kernels and
// the CPU references take them, validated once for the prefill and the decode entry points.
#pragma once

#include "llmk/attention.h"

namespace llmk::detail {

struct AttentionVariants {
  int window = 0;              // keys a causal row sees, its own included; 0: no window
  float softcap = 0.0f;        // 0: none
  const float* sinks = nullptr;  // float32 [heads_q]; null: none
  bool any() const { return window > 0 || softcap > 0.0f || sinks != nullptr; }
};

// Checks `o` for a call on q (heads_q = q.size(-2)) with `causal`: window >= 1 and causal,
// softcap finite and > 0 (in float too), sinks float32 [heads_q], contiguous, 4-byte aligned,
// on q's device. Errors name `op` and the argument.
AttentionVariants check_attention_options(const char* op, const AttentionOptions& o, const TensorView& q,
                                          bool causal);

}  // namespace llmk::detail
