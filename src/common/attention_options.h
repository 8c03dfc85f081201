// The validation of llmk::AttentionOptions (include/llmk/attention.h) into the variants the
// kernels and the CPU references take, once for the prefill and the decode entry points.
#pragma once

#include "common/attention_variants.h"
#include "llmk/attention.h"

namespace llmk::detail {

// Checks `o` for a call on q (heads_q = q.size(-2)) with `causal`: window >= 1 and causal,
// softcap finite and > 0 (in float too), sinks a head vector (check_head_vector). Errors name
// `op` and the argument.
AttentionVariants check_attention_options(const char* op, const AttentionOptions& o, const TensorView& q,
                                          bool causal);

// A float32 [heads_q] tensor of `arg` (the sinks, or the backward's dsinks): on q's device,
// contiguous, 4-byte aligned. Returns its data.
float* check_head_vector(const char* op, const char* arg, const TensorView& t, const TensorView& q);

}  // namespace llmk::detail
