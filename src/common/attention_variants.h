// The score variants of llmk::AttentionOptions (include/llmk/attention.h) as the kernels and
// the CPU references take them: held by the prefill's AttentionParams and decode's
// DecodeParams, filled by check_attention_options (common/attention_options.h).
#pragma once

#include "common/host_device.h"

namespace llmk::detail {

struct AttentionVariants {
  int window = 0;                // keys a causal row sees, its own included; 0: no window
  float softcap = 0.0f;          // 0: none
  const float* sinks = nullptr;  // float32 [heads_q]; null: none
  LLMK_HOST_DEVICE bool any() const { return window > 0 || softcap > 0.0f || sinks != nullptr; }
};

}  // namespace llmk::detail
