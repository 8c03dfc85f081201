// Attention (FlashAttention 2's algorithm), forward and backward: out = softmax(scale * q k^T) v
// per batch entry and query head, tiled with an online softmax so that the [seq_q, seq_k]
// score matrix is never stored. fp16 and bf16 tensors, fp32 accumulation and softmax.
//
// Shapes (any strides, last dim contiguous; strides and data 16-byte aligned):
//   q, out  [batch, seq_q, heads_q, head_dim]    k, v  [batch, seq_k, heads_kv, head_dim]
// heads_q is a multiple of heads_kv (GQA / MQA: query head h reads kv head
// h / (heads_q / heads_kv); nothing is copied). head_dim is 32, 64, 96, 128 or 256, the same
// for q, k and v. The [batch, heads, seq, head_dim] layout (PyTorch's SDPA convention) is its
// transpose, and q, k, v may be strided slices of one fused qkv projection.
//
// causal: query row i sees key j iff j <= i + seq_k - seq_q (the mask aligned to the
// bottom-right corner, as FlashAttention 2; the usual lower triangle when seq_q == seq_k).
// A row that sees no key (causal with seq_q > seq_k, or seq_k == 0) gets out = 0 and
// lse = -inf (the log of an empty sum).
// scale: finite and > 0, usually 1 / sqrt(head_dim).
// lse (optional, std::nullopt to skip): float32 [batch, heads_q, seq_q], contiguous,
// the natural-log log-sum-exp of each row of scale * q k^T over the keys it sees; what the
// backward pass and the merging of partial attention results need.
//
// Tensors on the GPU run there on `stream`; host tensors run the double-precision CPU
// reference (the naive O(seq_q * seq_k) algorithm).
#pragma once

#include <cuda_runtime_api.h>

#include <optional>
#include <vector>

#include "llmk/tensor.h"

namespace llmk {

// The score variants of Gemma 2/3, Mistral and gpt-oss; each is off when absent. The CPU
// backend (the double reference), the Hopper forward and backward and the decode kernel take
// them; the sm_80 forward and backward reject them before any work, and so does a CUDA
// backward asked for `dsinks` (compute it from out and lse, as llmk's autograd does).
struct AttentionOptions {
  // Sliding window (causal only): query row i, at position i' = i + seq_k - seq_q of the keys
  // (the causal mask's bottom-right alignment), sees the keys j with i' - window < j <= i':
  // `window` >= 1 keys, its own included (Mistral's and Gemma's sliding window).
  std::optional<int64_t> window;
  // Logit softcap (Gemma 2): each score s = scale * q.k becomes softcap * tanh(s / softcap);
  // finite and > 0.
  std::optional<double> softcap;
  // Attention sinks (gpt-oss): float32 [heads_q], contiguous, on q's device: one logit per
  // query head that joins every row's softmax denominator without a value, so that
  // out = sum_j exp(s_j - lse) v_j with lse = log(exp(sink) + sum_j exp(s_j)); lse (returned)
  // includes the sink, and a row that sees no key gets out = 0, lse = sink.
  std::optional<TensorView> sinks;
  bool any() const { return window.has_value() || softcap.has_value() || sinks.has_value(); }
};

void attention(const TensorView& out, const TensorView& q, const TensorView& k,
               const TensorView& v, bool causal, double scale,
               const std::optional<TensorView>& lse = std::nullopt, cudaStream_t stream = nullptr);
// With the score variants of `options` (AttentionOptions; the same call as above when none is
// set).
void attention(const TensorView& out, const TensorView& q, const TensorView& k, const TensorView& v, bool causal,
               double scale, const AttentionOptions& options, const std::optional<TensorView>& lse = std::nullopt,
               cudaStream_t stream = nullptr);

// Variable-length batches packed without padding (FlashAttention's varlen API):
//   q, out  [total_q, heads_q, head_dim]    k, v  [total_k, heads_kv, head_dim]
// Sequence b holds q rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and k/v rows
// [cu_seqlens_k[b], cu_seqlens_k[b + 1]); cu_seqlens_q/k are int32 [batch + 1], contiguous,
// on q's device. max_seqlen_q/k bound the sequence lengths (they size the launch grid).
// causal aligns each sequence's mask to its own bottom-right corner.
// lse (optional): float32 [heads_q, total_q], contiguous.
// The caller's contract on the GPU: cu_seqlens start at 0, never decrease, end at
// total_q / total_k, and no sequence is longer than max_seqlen_q / max_seqlen_k (checking
// device memory from the host would cost a sync; the kernel clamps every sequence to the
// packed tensors, so a broken contract never reads or writes outside them). The CPU
// backend checks all of it.
void attention_varlen(const TensorView& out, const TensorView& q, const TensorView& k,
                      const TensorView& v, const TensorView& cu_seqlens_q,
                      const TensorView& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                      bool causal, double scale,
                      const std::optional<TensorView>& lse = std::nullopt,
                      cudaStream_t stream = nullptr);
void attention_varlen(const TensorView& out, const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t max_seqlen_q,
                      int64_t max_seqlen_k, bool causal, double scale, const AttentionOptions& options,
                      const std::optional<TensorView>& lse = std::nullopt, cudaStream_t stream = nullptr);

// Backward of attention (FlashAttention 2's algorithm): the gradients dq, dk, dv of
// out = softmax(scale * q k^T) v for the upstream gradient dout, from the forward's inputs,
// its out and its lse (the backward recomputes P = exp(scale * q k^T - lse) tile by tile and
// never stores the [seq_q, seq_k] matrices):
//   D = rowsum(dout * out),  dP = dout v^T,  dS = P * (dP - D)
//   dv = P^T dout,  dk = scale * dS^T q,  dq = scale * dS k
// Shapes, dtypes and layouts as attention's: dq, dout like q ([batch, seq_q, heads_q, dim]),
// dk, dv like k ([batch, seq_k, heads_kv, dim]), any 16-byte aligned strides, one dtype for
// all eight tensors. GQA/MQA: dk and dv of kv head g are summed over the heads_q / heads_kv
// query heads that read it (in registers, in a fixed order; nothing is copied).
// lse: float32 [batch, heads_q, seq_q], contiguous, as the forward writes it. A row with
// lse = -inf (the forward's value for a row that sees no key) or +inf (FlashAttention's)
// has P = 0: its dq is 0 and it adds nothing to dk and dv, whatever its dout.
// causal and scale must be the forward's.
//
// dq, dk, dv are written whole (0 where nothing flows: keys no row sees, seq_q = 0, seq_k
// = 0); they overlap neither each other nor an input.
// deterministic: dq, dk and dv are bitwise identical run to run. dk and dv always are (one
// block owns each key tile and walks the query tiles in order). dq is by default summed
// across key tiles with fp32 atomics into the workspace (the order varies); deterministic
// makes the Hopper kernel add them in a fixed key-tile order (turn counters per query tile in
// the workspace), and the sm_80 path compute dq in a second kernel instead, one block per query
// tile walking the key tiles (S and dP computed twice: 7 GEMMs of work instead of 5).
// workspace: on the GPU a float32 CUDA buffer of at least attention_backward_workspace_size
// elements (the fp32 dq accumulator, D and the counters); ignored on the CPU (std::nullopt
// is fine).
// On an sm_90 GPU (with an sm_90a build) head dims 64, 128 and 256 run the Hopper (TMA +
// wgmma) main kernels, everything else the sm_80 (mma.sync) kernels; LLMK_ATTENTION_PATH=sm80|sm90
// forces one as for the forward (sm90 throws, naming the reason, for a call it cannot take).
// Host tensors run the double reference.
void attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        const TensorView& dout, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& out, const TensorView& lse,
                        bool causal, double scale, bool deterministic = false,
                        const std::optional<TensorView>& workspace = std::nullopt,
                        cudaStream_t stream = nullptr);
// With the forward's AttentionOptions (window, softcap and sinks must be the forward's; lse
// the forward's, which includes the sink). dsinks (optional): float32 [heads_q], written with
// the gradient of the sinks, -sum over the rows of head h of exp(sink_h - lse) * D with
// D = rowsum(dout * out).
void attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        const TensorView& dout, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& out, const TensorView& lse,
                        bool causal, double scale, const AttentionOptions& options,
                        const std::optional<TensorView>& dsinks = std::nullopt, bool deterministic = false,
                        const std::optional<TensorView>& workspace = std::nullopt,
                        cudaStream_t stream = nullptr);

// The varlen form: tensors packed as attention_varlen's ([total, heads, dim]; lse float32
// [heads_q, total_q]), cu_seqlens_q/k, max_seqlen_q/k and causal as the forward call's, with
// the same caller contract on the GPU (checked in full on the CPU).
void attention_varlen_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               const TensorView& dout, const TensorView& q, const TensorView& k,
                               const TensorView& v, const TensorView& out, const TensorView& lse,
                               const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                               int64_t max_seqlen_q, int64_t max_seqlen_k, bool causal,
                               double scale, bool deterministic = false,
                               const std::optional<TensorView>& workspace = std::nullopt,
                               cudaStream_t stream = nullptr);
void attention_varlen_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               const TensorView& dout, const TensorView& q, const TensorView& k,
                               const TensorView& v, const TensorView& out, const TensorView& lse,
                               const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                               int64_t max_seqlen_q, int64_t max_seqlen_k, bool causal, double scale,
                               const AttentionOptions& options,
                               const std::optional<TensorView>& dsinks = std::nullopt,
                               bool deterministic = false,
                               const std::optional<TensorView>& workspace = std::nullopt,
                               cudaStream_t stream = nullptr);

// Elements of float32 workspace a GPU backward needs, deterministic or not: q_rows = batch *
// seq_q (varlen: total_q) rows of heads_q heads: the fp32 dq accumulator (q_rows * heads_q *
// head_dim), D (q_rows * heads_q) and two int32 counters per row and head (the Hopper
// kernel's dq turns, and the flags by which a tile's first dq share is stored instead of
// added to a zeroed accumulator).
int64_t attention_backward_workspace_size(int64_t q_rows, int64_t heads_q, int64_t head_dim);

// The head dims attention and its backward accept (32, 64, 96, 128, 256); the CPU backend
// computes all of them.
std::vector<int64_t> attention_head_dims();
// Whether this build has CUDA kernels for `head_dim` (CMake option LLMK_HEAD_DIMS trims
// the list; default all).
bool attention_head_dim_compiled(int64_t head_dim);
// The head dims the Hopper (sm_90a) kernels take, as far as this build compiled them; the
// other compiled head dims run the sm_80 kernels.
std::vector<int64_t> attention_sm90_head_dims();

}  // namespace llmk
