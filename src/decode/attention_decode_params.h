// Kernel parameters of the decode attention (include/llmk/attention_decode.h) and the
// addressing and length rules shared by the CUDA kernels and the CPU reference.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/attention_types.h"
#include "common/attention_variants.h"
#include "common/host_device.h"
#include "llmk/dtype.h"

namespace llmk::detail {

// The K or V cache. A contiguous cache is one page per sequence (page b holds sequence b,
// page_size = max_len, no block table).
struct DecodeCacheTensor {
  void* data = nullptr;
  int64_t page_stride = 0, row_stride = 0, head_stride = 0;
  const float* scale = nullptr;  // fp8 cache: [heads_kv] dequantization scales
};

// Append: each new k element is rotated in fp32 and rounded to q's dtype (as rope_ and then
// a copy would do); an fp8 cache stores e4m3(value / scale) of that rounded value, the
// division in fp32, rounded to nearest even and saturated to +-448 (NaN stays NaN).
struct DecodeParams {
  AttentionTensor q, out, k_new, v_new;  // [batch, q_len, heads, head_dim]; k_new.data null: no append
  DecodeCacheTensor k, v;
  const int32_t* cache_seqlens = nullptr;  // [batch]
  const int32_t* block_table = nullptr;    // [batch, max_pages] (row stride block_table_stride); null: contiguous
  int64_t block_table_stride = 0;
  int max_pages = 1, page_size = 0, num_pages = 0;
  int capacity = 0;  // keys a sequence can hold: max_len, or max_pages * page_size

  const float* rotary_cos_sin = nullptr;  // [rotary_max_pos, rotary_dim]; null: no rotation
  int rotary_dim = 0, rotary_max_pos = 0;
  bool rotary_interleaved = false;  // GPT-J pairs (2i, 2i + 1); else NeoX (i, i + rotary_dim / 2)

  float* lse = nullptr;  // [batch, heads_q, q_len]; null: not wanted

  int batch = 0, q_len = 0, heads_q = 0, heads_kv = 0, group = 1, head_dim = 0;
  bool causal = true;
  float scale = 1.0f;
  float scale_log2 = 1.0f;  // scale * log2(e)
  AttentionVariants variants;  // window, softcap, sinks (the CPU reference and the 16-row kernels)

  // Split-KV: `splits` pieces per (sequence, kv head); with splits > 1 the pieces write
  // partial_out [splits, batch, q_len, heads_q, head_dim] and partial_lse
  // [splits, batch, q_len, heads_q] (float32, in the workspace) and a second kernel merges them.
  // cluster_merge (the launcher's choice, sm_90, splits <= kDecodeClusterMaxSplits): the
  // splits of one (sequence, kv head, row block) run as one thread-block cluster and combine
  // their pieces through distributed shared memory; the workspace is not used.
  int splits = 1;
  bool cluster_merge = false;
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
};

// The keys sequence b attends over: its cached tokens (+ q_len appended), clamped to the
// capacity so that a broken contract stays inside the cache.
LLMK_HOST_DEVICE inline int decode_seqlen_k(const DecodeParams& p, int b) {
  int64_t n = p.cache_seqlens[b];
  if (p.k_new.data != nullptr) n += p.q_len;
  return static_cast<int>(n < 0 ? 0 : (n > p.capacity ? p.capacity : n));
}

// Where token t of sequence b lives: its page (page ids out of range are clamped to the
// pages) and its row in that page.
struct DecodeCacheSlot {
  int64_t page = 0;
  int row = 0;
};

LLMK_HOST_DEVICE inline DecodeCacheSlot decode_cache_slot(const DecodeParams& p, int b, int t) {
  if (p.block_table == nullptr) return {b, t};
  int page = p.block_table[b * p.block_table_stride + t / p.page_size];
  page = page < 0 ? 0 : (page >= p.num_pages ? p.num_pages - 1 : page);
  return {page, t % p.page_size};
}

// The element offset of a cache slot from the cache's start (before the head offset).
LLMK_HOST_DEVICE inline int64_t decode_cache_row(const DecodeCacheTensor& c, DecodeCacheSlot s) {
  return s.page * c.page_stride + s.row * c.row_stride;
}

LLMK_HOST_DEVICE inline int64_t decode_cache_row(const DecodeParams& p, const DecodeCacheTensor& c, int b, int t) {
  return decode_cache_row(c, decode_cache_slot(p, b, t));
}

// The last key (exclusive) query token i may see among seqlen_k keys.
LLMK_HOST_DEVICE inline int decode_visible_keys(const DecodeParams& p, int seqlen_k, int i) {
  if (!p.causal) return seqlen_k;
  const int end = i + 1 + seqlen_k - p.q_len;
  return end < 0 ? 0 : (end > seqlen_k ? seqlen_k : end);
}

// The first key query i sees: the sliding window's left end (causal, bottom-right aligned),
// clamped to [0, decode_visible_keys]; 0 without a window.
LLMK_HOST_DEVICE inline int decode_first_key(const DecodeParams& p, int seqlen_k, int i) {
  const int end = decode_visible_keys(p, seqlen_k, i);
  if (p.variants.window <= 0) return 0;
  const int64_t first = int64_t{i} + 1 + seqlen_k - p.q_len - p.variants.window;
  return static_cast<int>(first < 0 ? 0 : (first > end ? end : first));
}

// The CUDA launcher (split choice, main kernel, merge) and the CPU reference, called after
// the arguments are validated. `splits_for` is the host-side choice the workspace size
// query and the launcher share.
// The most splits merged inside a cluster (the portable cluster size): without a workspace
// a call runs at most this many.
inline constexpr int kDecodeClusterMaxSplits = 8;
// `capacity`: the keys a split may have to cover (the cache's capacity, or less with a
// sliding window); `paged`: the cache comes with a block table; `variants`: the call has a
// score variant (16-row tiles).
int decode_splits_for(int batch, int heads_kv, int q_len, int group, int head_dim, bool fp8_cache, bool paged,
                      bool variants, int capacity, int device);
void attention_decode_cuda(const DecodeParams& p, DType dtype, DType cache_dtype, cudaStream_t stream);
void attention_decode_cpu(const DecodeParams& p, DType dtype, DType cache_dtype);

}  // namespace llmk::detail
