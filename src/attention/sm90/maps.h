// TMA maps over attention tensors, shared by the Hopper forward and backward launchers: a
// [batch, rows, heads, D] tensor (any 16-byte strides: transposed, fused qkv slices) as a
// 4-d map [batch, heads, rows, D] (dense) or [1, heads, total, D] (varlen), D innermost,
// boxes of box_rows rows x 64 columns with the 128-byte swizzle.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "attention/attention_params.h"
#include "llmk/dtype.h"

namespace llmk::detail {

// Whether TMA can address t: a 16-byte aligned pointer and strides (the batch stride only
// for dense batches).
bool attention_tma_ok(const AttentionTensor& t, bool varlen);

CUtensorMap attention_tma_map(const AttentionTensor& t, DType dtype, int head_dim, int heads, int64_t rows, int batch,
                              uint32_t box_rows);

}  // namespace llmk::detail
