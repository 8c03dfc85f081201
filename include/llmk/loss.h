// Losses over vocabulary logits.
//
// cross_entropy: per-row cross-entropy of logits [tokens, vocab] against target classes
// [tokens], as torch.nn.functional.cross_entropy(reduction="none", ignore_index,
// label_smoothing) plus a z-loss, with the gradient optionally written in the same pass:
//   z    = logits in fp32, lse = log sum_j exp(z_j)
//   loss = (1 - eps) (lse - z_t) + eps (lse - mean_j z_j) + z_loss lse^2
//        (PyTorch's label smoothing: eps spread over all vocab classes), 0 where
//        target == ignore_index
//   dlogits_j = grad_scale * (softmax(z)_j (1 + 2 z_loss lse) - (1 - eps) [j == t] - eps / vocab),
//        0 on ignored rows. grad_scale folds the reduction in: reduction="mean" passes
//        1 / (number of rows not ignored), "sum" passes 1.
//
// loss, lse: [tokens] float32 (lse is written for ignored rows too: the backward needs it).
// logits: [tokens, vocab] float32, float16 or bfloat16; rows may be strided (row stride >=
//   vocab), the last dim contiguous.
// target: [tokens] int64 or int32.
// label_smoothing in [0, 1]; z_loss >= 0 and grad_scale finite in float32.
// dlogits: logits' shape and dtype; it may be logits itself (the gradient overwrites the
//   logits in the forward, so the backward reads nothing); any other overlap is rejected.
//
// -inf logits (masked vocabulary entries) get probability 0. A row that is entirely -inf
// with a valid target has loss +inf and lse -inf; with label_smoothing > 0 a single -inf
// logit makes the loss +inf too (its log-probability is -inf), as in PyTorch.
//
// Out-of-range targets (not ignore_index and outside [0, vocab)): CPU tensors raise an
// error naming the row and the value, before anything is written. CUDA tensors cannot be
// checked without a synchronization: that row's loss and gradient are NaN (its lse is
// valid), and nothing outside the logits row is read.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "llmk/tensor.h"

namespace llmk {

void cross_entropy(const TensorView& loss, const TensorView& lse, const TensorView& logits,
                   const TensorView& target, int64_t ignore_index, double label_smoothing, double z_loss,
                   double grad_scale, const std::optional<TensorView>& dlogits = std::nullopt,
                   cudaStream_t stream = nullptr);

// The backward from the forward's lse, in one pass over the logits (read once, gradient
// written once): dlogits[r] = dloss[r] * d loss_r / d logits[r] with the formula above
// (grad_scale = dloss[r]), zero on ignored rows. dloss, lse: [tokens] float32 (lse as
// cross_entropy wrote it); dlogits: logits' shape and dtype, may be logits itself.
// Out-of-range targets: as cross_entropy (CPU: an error; GPU: a NaN gradient row).
void cross_entropy_backward(const TensorView& dlogits, const TensorView& dloss, const TensorView& logits,
                            const TensorView& target, const TensorView& lse, int64_t ignore_index,
                            double label_smoothing, double z_loss, cudaStream_t stream = nullptr);

}  // namespace llmk
