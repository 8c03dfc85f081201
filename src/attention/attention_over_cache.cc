// Attention over a KV cache by the Hopper forward (common/cache_attention.h): the call's
// AttentionParams, its K and V the cache's pages, sequence b's keys its cache_seqlens[b]
// (sm90/cache_loads.cuh loads them). attention_decode hands over its calls with many query
// tokens; the score variants' kernels run them (2-consumer tiles).
#include "attention/attention_params.h"
#include "common/cache_attention.h"

namespace llmk::detail {

namespace {

AttentionParams params_of(const CacheAttentionCall& c) {
  AttentionParams p;
  p.q = c.q;
  p.out = c.out;
  p.k = c.k;
  p.v = c.v;
  p.lse = c.lse;
  p.lse_batch_stride = int64_t{c.heads_q} * c.q_len;  // lse [batch, heads_q, q_len]
  p.lse_head_stride = c.q_len;
  p.batch = c.batch;
  p.heads_q = c.heads_q;
  p.group = c.group;
  p.head_dim = c.head_dim;
  p.seqlen_q = c.q_len;
  p.seqlen_k = c.capacity;
  p.causal = c.causal;
  p.scale = c.scale;
  p.scale_log2 = c.scale_log2;
  p.variants = c.variants;
  p.cache_seqlens = c.cache_seqlens;
  p.block_table = c.block_table;
  p.block_table_stride = c.block_table_stride;
  p.page_size = c.page_size;
  p.num_pages = c.num_pages;
  return p;
}

}  // namespace

bool attention_over_cache_takes(const CacheAttentionCall& c, DType dtype, int device, const char** why) {
  if (c.block_table && c.page_size % 8 != 0)
    return *why = "the page size is not a multiple of 8 (the Hopper forward's TMA boxes are whole 8-row swizzle atoms)",
           false;
  if (c.head_dim > 128) return *why = "the head dim is above 128 (the Hopper forward reads caches at 64-128)", false;
  if (c.capacity == 0) return *why = "the cache holds no keys", false;
  return attention_sm90_takes(params_of(c), dtype, device, why);
}

void attention_over_cache(const CacheAttentionCall& c, DType dtype, cudaStream_t stream) {
  attention_forward_sm90(params_of(c), dtype, stream);
}

}  // namespace llmk::detail
