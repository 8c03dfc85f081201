// Rotary position embedding (RoPE), in place on the query and key heads (rope_), and its
// backward (rope_backward_).
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

}  // namespace llmk
