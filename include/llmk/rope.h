// Rotary position embedding (RoPE), in place on the query and key heads (rope_) or out of
// place into new tensors (rope), and its backward (rope_backward_, rope_backward).
//
// Each head vector x[0:head_dim] of the token at position `pos` has its first rot_dim
// elements rotated pairwise by the angles pos * inv_freq[i], i < rot_dim / 2; elements
// from rot_dim on are left as they are (partial rotary, as GPT-NeoX and Phi):
//   (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
// The pairs are (x[i], x[i + rot_dim / 2]) in the NeoX style (Llama, Mistral, Qwen: the
// "rotate half" of Hugging Face) and (x[2i], x[2i + 1]) in the GPT-J style (interleaved).
// The backward applies the inverse rotation (sin negated) to the gradients, which is the
// transpose of the forward.
//
// The angles come either from a cos/sin cache or from theta:
// - cos_sin_cache: float32 [max_pos, rot_dim], row p holding cos(p * inv_freq[i]) in
//   columns [0, rot_dim / 2) and sin(...) in [rot_dim / 2, rot_dim) (vLLM's and
//   FlashInfer's layout). A position outside [0, max_pos) is never read from the cache:
//   the CPU backend rejects the call, the GPU kernel writes NaN into that token's rotated
//   elements (checking on the host would cost a device sync).
// - RopeTheta: inv_freq[i] = theta^(-2i / rot_dim), optionally rescaled as Llama 3.1 does
//   for long contexts. The GPU computes the frequency and angle in double and then the
//   cos/sin of the angle reduced to [-pi, pi] in float, so large positions keep full fp32
//   accuracy (fp32 caches, as Hugging Face builds them, lose ~1e-7 * pos radians).
//
// Layouts: q is [tokens, heads_q, head_dim] or [batch, seq, heads_q, head_dim] with any
// strides except a contiguous last dim, so q and k may be head slices of one fused qkv
// tensor and the [batch, heads, seq, head_dim] layout is accepted as its transpose. k has
// q's leading dims, dtype and head_dim and its own head count (GQA/MQA); std::nullopt
// rotates q alone. positions (int32 or int64, contiguous) has q's leading dims ([tokens]
// or [batch, seq]); [seq] or [1, seq] broadcasts over the batch.
// Math is fp32 (f32, f16, bf16 tensors) with one rounding per element. Tensors on the GPU
// run there on `stream`; host tensors run the double-precision CPU reference.
//
// Out of place (rope, rope_backward): q and k are only read, and may be any readable view
// (a stride of 0 included; they may share memory with each other). q_out and k_out have
// q's and k's shapes, dtype and device and their own strides (contiguous last dim); each
// head of q_out gets the rotated q head with its elements from rot_dim to head_dim copied
// unchanged, so q_out is the value that rope_ would leave in q. k_out is given exactly when
// k is. An output must not share memory with any other tensor of the call (head slices of
// one fused output tensor are accepted), except that an output may be exactly its own
// input (same data pointer, shape and strides): that tensor is then rotated in place, as
// rope_ does. Each element is read and written once: one pass, where a copy followed by
// rope_ takes two.
#pragma once

#include <cuda_runtime_api.h>

#include <optional>

#include "llmk/tensor.h"

namespace llmk {

enum class RopeStyle { neox, gptj };

// Llama 3.1's long-context frequency scaling: wavelengths longer than
// original_max_position / low_freq_factor are divided by `factor`, shorter than
// original_max_position / high_freq_factor are kept, and those between are interpolated.
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position = 8192.0;
};

struct RopeTheta {
  int64_t rot_dim = 0;  // 0: the whole head_dim
  double theta = 10000.0;
  std::optional<Llama3RopeScaling> llama3;
};

// q and k (optional) are rotated in place.
void rope_(const TensorView& q, const std::optional<TensorView>& k, const TensorView& positions,
           const TensorView& cos_sin_cache, RopeStyle style, cudaStream_t stream = nullptr);
void rope_(const TensorView& q, const std::optional<TensorView>& k, const TensorView& positions,
           const RopeTheta& freqs, RopeStyle style, cudaStream_t stream = nullptr);

// dq, dk (optional): the gradients of the rotated q and k, replaced in place by those of
// the inputs.
void rope_backward_(const TensorView& dq, const std::optional<TensorView>& dk,
                    const TensorView& positions, const TensorView& cos_sin_cache, RopeStyle style,
                    cudaStream_t stream = nullptr);
void rope_backward_(const TensorView& dq, const std::optional<TensorView>& dk,
                    const TensorView& positions, const RopeTheta& freqs, RopeStyle style,
                    cudaStream_t stream = nullptr);

// Out of place: q_out (k_out) receives the rotated q (k); q and k are not written.
void rope(const TensorView& q_out, const std::optional<TensorView>& k_out, const TensorView& q,
          const std::optional<TensorView>& k, const TensorView& positions, const TensorView& cos_sin_cache,
          RopeStyle style, cudaStream_t stream = nullptr);
void rope(const TensorView& q_out, const std::optional<TensorView>& k_out, const TensorView& q,
          const std::optional<TensorView>& k, const TensorView& positions, const RopeTheta& freqs,
          RopeStyle style, cudaStream_t stream = nullptr);

// Out of place backward: dq_out (dk_out) receives the gradient of rope's input q (k) from
// dq (dk), the gradient of its output; dq and dk are not written.
void rope_backward(const TensorView& dq_out, const std::optional<TensorView>& dk_out, const TensorView& dq,
                   const std::optional<TensorView>& dk, const TensorView& positions,
                   const TensorView& cos_sin_cache, RopeStyle style, cudaStream_t stream = nullptr);
void rope_backward(const TensorView& dq_out, const std::optional<TensorView>& dk_out, const TensorView& dq,
                   const std::optional<TensorView>& dk, const TensorView& positions, const RopeTheta& freqs,
                   RopeStyle style, cudaStream_t stream = nullptr);

}  // namespace llmk
