// The tensor view of attention's kernel parameters, shared by the attention family
// (attention/attention_params.h) and decode (decode/attention_decode_params.h).
#pragma once

#include <cstdint>

namespace llmk::detail {

// One of q, k, v, out: strides in elements, the head dim contiguous. A row is one token
// of one head.
struct AttentionTensor {
  void* data = nullptr;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
};

}  // namespace llmk::detail
