// Attention over a KV cache run by the prefill kernels: what attention_decode (decode family)
// hands the attention family for calls with many query tokens (chunked prefill, prefix
// caching), where the decode kernel would re-read the keys once per tile of query rows.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/attention_types.h"
#include "common/attention_variants.h"
#include "llmk/dtype.h"

namespace llmk::detail {

// q and out [batch, q_len, heads_q, head_dim]. k and v: the cache's pages [num_pages,
// page_size, heads_kv, head_dim] (batch_stride = the page stride); a contiguous cache is one
// page per sequence (page b, page_size = max_len, no block table). Sequence b attends over
// its first cache_seqlens[b] keys (clamped to capacity); token t lives in page
// block_table[b][t / page_size] (clamped to the pages), row t % page_size. lse: float32
// [batch, heads_q, q_len] or null.
struct CacheAttentionCall {
  AttentionTensor q, out, k, v;
  const int32_t* cache_seqlens = nullptr;
  const int32_t* block_table = nullptr;  // null: contiguous
  int64_t block_table_stride = 0;
  int page_size = 0, num_pages = 0, capacity = 0;
  int batch = 0, q_len = 0, heads_q = 0, group = 1, head_dim = 0;
  bool causal = true;
  float scale = 1.0f, scale_log2 = 1.0f;
  AttentionVariants variants;
  float* lse = nullptr;
};

// Whether the Hopper forward takes the call on `device` (why not, in `why`): an sm_90a
// build on sm_90, head dims 64-128, a 16-bit cache in q's dtype (no fp8), 16-byte aligned
// strides, page sizes a multiple of 8 (each TMA box of a page fills whole 1024-byte swizzle
// atoms).
bool attention_over_cache_takes(const CacheAttentionCall& c, DType dtype, int device, const char** why);
void attention_over_cache(const CacheAttentionCall& c, DType dtype, cudaStream_t stream);

}  // namespace llmk::detail
