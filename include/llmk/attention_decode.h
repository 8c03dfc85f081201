// Decode attention over a KV cache: the attention of a few new query tokens per sequence
// (q_len 1 for a decode step, 2-16 for speculative-decoding verification) against each
// sequence's cached keys and values, optionally appending the new tokens' k/v to the cache
// (and rotating q and the new k with RoPE) in the same launch. Any q_len >= 1 is taken and
// exact; the decode kernel is built for q_len x (heads_q / heads_kv) rows up to one tile
// (16-64 rows by head dim), which share one pass over the keys. From 64 query tokens (a
// prefill chunk over a cache: chunked prefill, prefix caching) a call without append, on an
// sm_90 GPU, with a cache in q's dtype, head dims 64-128 and page sizes a multiple of 8 runs
// the Hopper prefill kernel over the cache instead (128-row tiles per query head, the pages
// read by TMA); LLMK_DECODE_PATH=auto|decode|prefill forces one (prefill raises, naming the
// reason, where it cannot take the call). Appending calls run the decode kernel at any q_len:
// write a long chunk's k/v into the cache first, then call without append.
//
//   q, out    [batch, q_len, heads_q, head_dim]     fp16 or bf16, any 16-byte-aligned strides
//   cache.k / cache.v:
//     contiguous  [batch, max_len, heads_kv, head_dim]      (no block_table)
//     paged       [num_pages, page_size, heads_kv, head_dim] with block_table int32
//                 [batch, max_pages]: token t of sequence b lives in page
//                 block_table[b][t / page_size], row t % page_size (any page order; page
//                 sizes 1 to 256 and beyond)
//     in q's dtype, or float8 e4m3 with per-kv-head float32 scales cache.k_scale /
//     cache.v_scale [heads_kv] (a stored value x means x * scale).
//   cache_seqlens  int32 [batch]: the tokens already in each sequence's cache (0 allowed).
//
// Without `append`, sequence b attends over its cache_seqlens[b] cached keys; the q tokens
// are the last q_len of them (their k/v already written). With `append`, k_new / v_new
// [batch, q_len, heads_kv, head_dim] (q's dtype) are written into the cache at positions
// cache_seqlens[b] + i first (quantized with the scales for an fp8 cache) and the sequence
// attends over cache_seqlens[b] + q_len keys; with append.rotary_cos_sin, q and k_new are
// rotated first (RoPE as rope_ with a cos/sin cache, positions cache_seqlens[b] + i; q is
// not modified, its rotated copy is used). cache_seqlens itself is not updated: the caller
// adds q_len after the call.
//
// causal: query i sees key j iff j <= i + seqlen_k - q_len (bottom-right aligned, as the
// prefill kernel); with q_len 1 it changes nothing. A query that sees no key (a sequence
// with no keys) gets out = 0 and lse = -inf.
// GQA/MQA: heads_q a multiple of heads_kv, any group size; the query heads (and q tokens) of
// one kv head share one pass over its keys and values.
// lse (optional): float32 [batch, heads_q, q_len], contiguous, natural log.
//
// Split-KV: the keys of each (sequence, kv head) are cut into pieces run by separate blocks
// and merged by their lse, so that a small batch with long contexts fills the GPU. The
// number of pieces is chosen on the host from the shapes (batch, heads, the cache's
// capacity) and the SM count, never from cache_seqlens (no host sync): a decode step is
// CUDA-graph capturable and replays with new lengths. On sm_90, 2-8 pieces merge inside a
// thread-block cluster; more pieces write partial results to `workspace`, float32 with at
// least attention_decode_workspace_size(...) elements (a contiguous 1-d tensor on q's
// device), merged by a second small kernel. Without a workspace the call runs at most 8
// pieces, merged in a cluster (one piece per (sequence, kv head) on GPUs without clusters).
//
// The caller's contract on the GPU (device memory cannot be checked without a sync):
// cache_seqlens[b] (+ q_len with append) <= the cache's capacity per sequence (max_len, or
// max_pages * page_size) and every block_table entry a sequence uses is in [0, num_pages).
// The kernel clamps lengths to the capacity and page ids to the pages, so a broken contract
// never reads or writes outside the tensors. The CPU backend checks all of it and raises.
//
// Host tensors run the double-precision CPU reference.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "llmk/attention.h"
#include "llmk/rope.h"
#include "llmk/tensor.h"

namespace llmk {

struct DecodeCache {
  TensorView k, v;
  std::optional<TensorView> block_table;       // int32 [batch, max_pages]; absent: contiguous
  std::optional<TensorView> k_scale, v_scale;  // float32 [heads_kv]; required for fp8, else absent
};

struct DecodeAppend {
  TensorView k_new, v_new;                        // [batch, q_len, heads_kv, head_dim]
  std::optional<TensorView> rotary_cos_sin;       // float32 [max_pos, rot_dim], as rope_'s cache
  RopeStyle rotary_style = RopeStyle::neox;
};

// The head dims attention_decode accepts (64, 96, 128, 256; the GPU ones as far as
// attention_head_dim_compiled says).
std::vector<int64_t> attention_decode_head_dims();

// float32 elements of workspace the call with these q and cache shapes may use on `device`
// (0 when it runs unsplit).
int64_t attention_decode_workspace_size(const TensorView& q, const DecodeCache& cache, int device);

void attention_decode(const TensorView& out, const TensorView& q, const DecodeCache& cache,
                      const TensorView& cache_seqlens, const std::optional<DecodeAppend>& append,
                      bool causal, double scale, const std::optional<TensorView>& lse = std::nullopt,
                      const std::optional<TensorView>& workspace = std::nullopt,
                      cudaStream_t stream = nullptr);
// With the score variants of AttentionOptions (include/llmk/attention.h) over the cache: the
// window counts back from each query's own position (seqlen_k - q_len + i), causal required;
// softcap and sinks as the prefill's (the GPU kernel: the splits share the keys from the
// first token's window on; the sink joins the denominator once).
void attention_decode(const TensorView& out, const TensorView& q, const DecodeCache& cache,
                      const TensorView& cache_seqlens, const std::optional<DecodeAppend>& append,
                      bool causal, double scale, const AttentionOptions& options,
                      const std::optional<TensorView>& lse = std::nullopt,
                      const std::optional<TensorView>& workspace = std::nullopt,
                      cudaStream_t stream = nullptr);

}  // namespace llmk
