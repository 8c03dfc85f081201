// Kernel parameters of the attention forward and backward and the sequence bounds shared by
// the CUDA kernels and the CPU references.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <type_traits>

#include "common/attention_types.h"
#include "common/attention_variants.h"
#include "common/head_dims.h"
#include "common/host_device.h"
#include "llmk/dtype.h"
#include "llmk/error.h"

namespace llmk::detail {

struct AttentionParams {
  AttentionTensor q, k, v, out;
  float* lse = nullptr;  // null: not wanted
  int64_t lse_batch_stride = 0, lse_head_stride = 0;
  int batch = 0, heads_q = 0, group = 1;  // group = heads_q / heads_kv
  int head_dim = 0;
  // Dense batches: every sequence has these lengths. Varlen: the maxima (grid size).
  int seqlen_q = 0, seqlen_k = 0;
  // Varlen: int32 [batch + 1] prefix sums; null for dense batches.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int64_t total_q = 0, total_k = 0;  // varlen: rows of the packed tensors
  bool causal = false;
  float scale = 1.0f;
  float scale_log2 = 1.0f;  // scale * log2(e): the softmax runs on exp2
  AttentionVariants variants;  // window, softcap, sinks (the CPU reference and the Hopper forward)
  // Keys and values from a KV cache (attention_over_cache; the Hopper forward's variant
  // kernels only): k and v are pages [num_pages, page_size, heads_kv, D] (batch_stride the
  // page stride; a contiguous cache has a page per sequence, no table), sequence b's keys
  // are its first cache_seqlens[b] (clamped to seqlen_k, the capacity), token t in page
  // block_table[b][t / page_size]. kv_box_rows: the rows of one TMA box of K or V (a page's
  // whole 8-row swizzle atoms, at most a key block).
  const int32_t* cache_seqlens = nullptr;
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;
  int page_size = 0, num_pages = 0, kv_box_rows = 0;

  // Where (batch entry, query head) starts in lse's layout, which the backward's per-row
  // arrays share (D, the dq accumulator's rows, the turn counters): add the packed row,
  // q_start + the row in the sequence.
  LLMK_HOST_DEVICE int64_t lse_offset(int64_t batch_entry, int64_t head) const {
    return batch_entry * lse_batch_stride + head * lse_head_stride;
  }
};

// Where sequence `b` lies: its first row in the (packed) tensor and its lengths.
struct SequenceBounds {
  int64_t q_start = 0, k_start = 0;
  int seqlen_q = 0, seqlen_k = 0;
};

// Clamps a varlen range to [0, total): a broken caller contract never leaves the tensors.
LLMK_HOST_DEVICE inline void packed_range(const int32_t* cu, int b, int64_t total, int64_t& start,
                                          int& len) {
  int64_t first = cu[b], last = cu[b + 1];
  first = first < 0 ? 0 : (first > total ? total : first);
  last = last < first ? first : (last > total ? total : last);
  start = first;
  len = static_cast<int>(last - first);
}

LLMK_HOST_DEVICE inline SequenceBounds sequence_bounds(const AttentionParams& p, int b) {
  SequenceBounds s;
  if (p.cu_seqlens_q == nullptr) {
    s.seqlen_q = p.seqlen_q;
    s.seqlen_k = p.seqlen_k;
    if (p.cache_seqlens) {
      const int n = p.cache_seqlens[b];
      s.seqlen_k = n < 0 ? 0 : (n > p.seqlen_k ? p.seqlen_k : n);
    }
    return s;
  }
  packed_range(p.cu_seqlens_q, b, p.total_q, s.q_start, s.seqlen_q);
  packed_range(p.cu_seqlens_k, b, p.total_k, s.k_start, s.seqlen_k);
  return s;
}

// The last key (exclusive) that query row `row` may see: the causal mask is aligned to
// the bottom-right corner of the [seqlen_q, seqlen_k] score matrix.
LLMK_HOST_DEVICE inline int64_t visible_keys(const SequenceBounds& s, bool causal, int64_t row) {
  if (!causal) return s.seqlen_k;
  const int64_t end = row + 1 + s.seqlen_k - s.seqlen_q;
  return end < 0 ? 0 : (end > s.seqlen_k ? s.seqlen_k : end);
}

// The first key query row `row` may see: with a sliding window of `window` keys (causal),
// the window's left end (bottom-right aligned as the causal mask); 0 otherwise. Clamped to
// visible_keys (an empty range when the window lies wholly before the keys).
LLMK_HOST_DEVICE inline int64_t first_visible_key(const SequenceBounds& s, bool causal, int window, int64_t row) {
  const int64_t end = visible_keys(s, causal, row);
  if (window <= 0) return 0;
  const int64_t first = row + 1 + s.seqlen_k - s.seqlen_q - window;
  return first < 0 ? 0 : (first > end ? end : first);
}

// The head dims whose Hopper forward stores O through shared memory and TMA (96, 128 and 256;
// 64 from registers): the kernel's AttentionSm90Tile::kTmaOut, whose note has the reasons,
// and the launcher's attention_sm90_tma_out.
constexpr bool attention_sm90_stages_output(int64_t head_dim) { return head_dim >= 96; }

// The backward's parameters: the forward's (lse required) and the gradients. D = rowsum(dout
// * out) and the fp32 dq accumulator live in the caller's workspace, indexed like lse: the
// row of (batch b, head h, sequence row i) is r = fwd.lse_offset(b, h) + q_start + i; D[r] is
// one float, the accumulator's row D * r .. D * r + head_dim - 1.
struct AttentionBackwardParams {
  AttentionParams fwd;
  AttentionTensor dout, dq, dk, dv;
  float* delta = nullptr;     // D, lse's layout
  float* dsinks = nullptr;    // the sinks' gradient, float32 [heads_q] (null: not wanted)
  float* dq_accum = nullptr;  // null: the sm_80 deterministic path (dq from its own kernel, no atomics)
  // The Hopper kernel's counters (null on the sm_80 path), zeroed by the rows kernel: per
  // (query row of a tile's first row in lse's layout, consumer half; half 0 alone where the
  // consumers pass a tile's turn jointly), the key blocks that have added their share of that
  // tile's dq (dq_ordered), or whether its first share is stored (dq_first_store).
  int* dq_counters = nullptr;
  int heads_kv = 0;
  // deterministic: the key blocks of a tile add their dq shares in a fixed order (turns).
  bool dq_ordered = false;
  // Set by attention_backward_sm90_plan. rotate_walk (non-causal): key block n of a sequence's
  // NB starts its walk over the query tiles at tile n * tiles / NB and wraps around, so that
  // the blocks reach each tile one after another (a step apart) instead of all at once.
  // dq_first_store: the first key block of each tile (rank 0 of the turns) stores its share
  // instead of adding it, and the others add theirs once that store has completed, so the
  // rows kernel does not zero the accumulator (134 MB fewer bytes at 16k tokens x 2048).
  bool rotate_walk = false;
  bool dq_first_store = false;
};

// LLMK_ATTENTION_PATH, read on every forward and backward call: auto (or unset) runs the
// Hopper kernel where it takes the call and the sm_80 kernel elsewhere; sm80 forces the
// sm_80 kernel; sm90 the Hopper one (an error naming the reason where it cannot take the
// call). Another value is an error naming `op`. attention_runs_sm90 says whether a call runs
// the Hopper kernel: `takes(device, &why)` (not asked when sm80 is forced) says whether that
// kernel takes it on the current device.
bool attention_runs_sm90(const char* op, const std::function<bool(int device, const char** why)>& takes);

// The CUDA launcher and the CPU reference, called after the arguments are validated.
// attention_forward_cuda picks the path: the Hopper kernel when attention_sm90_takes,
// else the sm_80 kernel (attention_runs_sm90).
void attention_forward_cuda(const AttentionParams& p, DType dtype, cudaStream_t stream);
void attention_forward_sm80(const AttentionParams& p, DType dtype, cudaStream_t stream);

// The Hopper kernel (sm90/forward.cu): an sm_90 device with an sm_90a build,
// dense or varlen batches, attention_sm90_head_dim's head dims, 16-byte aligned strides. Returns false,
// with the reason in `why`, for calls it does not take.
bool attention_sm90_takes(const AttentionParams& p, DType dtype, int device, const char** why);
// Its consumer warpgroups of 64 query rows for a call: 3 at head dim 64 (192-row tiles)
// except causal below 8192 query rows, else 2.
int attention_sm90_consumers(const AttentionParams& p);
// Whether the call's O leaves through shared memory and TMA stores: head dims 96, 128 and 256,
// where out is TMA-addressable (an out TMA cannot address is stored from registers by the
// same kernel). Sets the maps' tma_out.
bool attention_sm90_tma_out(const AttentionParams& p);
void attention_forward_sm90(const AttentionParams& p, DType dtype, cudaStream_t stream);
void attention_forward_cpu(const AttentionParams& p, DType dtype);

// The backward: preprocess (D, zeroing the counters and, unless the Hopper kernel stores
// each tile's first dq share, the accumulator), the main kernel
// (dk, dv and the dq reductions: the Hopper one when attention_backward_sm90_takes, else the
// sm_80 one, as attention_runs_sm90 says), then the dq conversion or, deterministic on the
// sm_80 path, the dq kernel (sm80/backward.cu); the double reference
// (attention_backward_cpu.cc).
void attention_backward_cuda(const AttentionBackwardParams& p, DType dtype, cudaStream_t stream);

// The Hopper main kernel (sm90/backward.cu): an sm_90 device with an sm_90a build,
// attention_sm90_head_dim's head dims, q, k, v and dout TMA-addressable (16-byte strides). Returns false,
// with the reason in `why`, for calls it does not take.
bool attention_backward_sm90_takes(const AttentionBackwardParams& p, DType dtype, int device, const char** why);
// Sets p.rotate_walk and p.dq_first_store for the Hopper kernel (before the rows kernel, which
// zeroes the accumulator only without dq_first_store).
void attention_backward_sm90_plan(AttentionBackwardParams& p);
void attention_backward_sm90(const AttentionBackwardParams& p, DType dtype, cudaStream_t stream);
void attention_backward_cpu(const AttentionBackwardParams& p, DType dtype);

}  // namespace llmk::detail
