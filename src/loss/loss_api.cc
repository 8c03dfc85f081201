// Public entry points of the loss family: validate every argument (a rejected call writes
// nothing), then run the CUDA launcher or the CPU reference.
#include <cmath>

#include "common/cuda_check.h"
#include "common/rows.h"
#include "llmk/loss.h"
#include "loss/cross_entropy.h"

namespace llmk {

using detail::Rows;

namespace {

constexpr const char* kOp = "cross_entropy";
constexpr const char* kBackward = "cross_entropy_backward";

// The kernels use the value in float32: it must be finite there.
void check_float_finite(const char* arg, double value, const char* op = kOp) {
  LLMK_CHECK(std::isfinite(value) && std::isfinite(static_cast<float>(value)), op, ": ", arg,
             " must be finite in float32, got ", value);
}

// A [tokens] output or index tensor on logits' device.
void check_per_row(const char* arg, const TensorView& t, const TensorView& logits, int64_t tokens,
                   const char* op = kOp) {
  detail::check_same_device(op, arg, t, "logits", logits);
  detail::check_vector(op, arg, t, tokens);
}

// logits [tokens, vocab] of a float dtype, int64/int32 target [tokens], and the loss
// arguments both ops take; returns logits' rows.
Rows check_logits_and_target(const char* op, const TensorView& logits, const TensorView& target,
                             double label_smoothing, double z_loss) {
  detail::check_float_dtype(op, "logits", logits);
  LLMK_CHECK(logits.ndim() == 2, op, ": logits must be 2-d [tokens, vocab], got shape ",
             detail::shape_string(logits));
  const Rows lr = detail::as_rows(op, "logits", logits);
  LLMK_CHECK(target.dtype() == DType::i64 || target.dtype() == DType::i32, op, ": target has dtype ",
             dtype_name(target.dtype()), ", expected int64 or int32");
  check_per_row("target", target, logits, lr.rows, op);
  LLMK_CHECK(lr.rows == 0 || lr.d > 0, op, ": logits has ", lr.rows, " rows of 0 classes");
  LLMK_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op,
             ": label_smoothing must be in [0, 1], got ", label_smoothing);
  check_float_finite("z_loss", z_loss, op);
  LLMK_CHECK(z_loss >= 0.0, op, ": z_loss must be >= 0, got ", z_loss);
  return lr;
}

// The part of both ops' kernel parameters that describes the rows.
detail::CrossEntropyRows rows_params(const Rows& lr, const Rows& dr, const TensorView& target, int64_t ignore_index,
                                     double label_smoothing, double z_loss) {
  return {dr.data,      lr.data,      target.data(), lr.rows,         lr.d, lr.row_stride,
          dr.row_stride, ignore_index, target.dtype() == DType::i64, label_smoothing, z_loss};
}

// The CPU path checks every target before anything is written.
void check_targets_in_range(const TensorView& target, int64_t tokens, int64_t vocab, int64_t ignore_index,
                            const char* op = kOp) {
  const bool i64 = target.dtype() == DType::i64;
  for (int64_t r = 0; r < tokens; ++r) {
    const int64_t t = i64 ? static_cast<const int64_t*>(target.data())[r]
                          : static_cast<const int32_t*>(target.data())[r];
    LLMK_CHECK(t == ignore_index || (t >= 0 && t < vocab), op, ": target[", r, "] = ", t,
               " is out of range for ", vocab, " classes (expected 0 <= target < ", vocab,
               " or ignore_index ", ignore_index, ")");
  }
}

}  // namespace

void cross_entropy(const TensorView& loss, const TensorView& lse, const TensorView& logits,
                   const TensorView& target, int64_t ignore_index, double label_smoothing, double z_loss,
                   double grad_scale, const std::optional<TensorView>& dlogits, cudaStream_t stream) {
  const Rows lr = check_logits_and_target(kOp, logits, target, label_smoothing, z_loss);
  const int64_t tokens = lr.rows, vocab = lr.d;
  detail::check_dtype(kOp, "loss", loss, DType::f32);
  check_per_row("loss", loss, logits, tokens);
  detail::check_dtype(kOp, "lse", lse, DType::f32);
  check_per_row("lse", lse, logits, tokens);
  const Rows dr = dlogits ? detail::check_like(kOp, "dlogits", *dlogits, "logits", logits) : Rows{};
  check_float_finite("grad_scale", grad_scale);
  detail::check_no_overlap(kOp, "loss", loss, "lse", lse, false);
  for (const auto& [name, out] : {std::pair<const char*, const TensorView*>{"loss", &loss}, {"lse", &lse}}) {
    detail::check_no_overlap(kOp, name, *out, "logits", logits, false);
    detail::check_no_overlap(kOp, name, *out, "target", target, false);
    if (dlogits) detail::check_no_overlap(kOp, name, *out, "dlogits", *dlogits, false);
  }
  if (dlogits) {
    detail::check_no_overlap(kOp, "dlogits", *dlogits, "logits", logits, /*allow_identical=*/true);
    detail::check_no_overlap(kOp, "dlogits", *dlogits, "target", target, false);
  }
  if (tokens == 0) return;
  const detail::CrossEntropyParams p{rows_params(lr, dr, target, ignore_index, label_smoothing, z_loss),
                                     static_cast<float*>(loss.data()), static_cast<float*>(lse.data()),
                                     grad_scale};
  if (!logits.is_cuda()) {
    check_targets_in_range(target, tokens, vocab, ignore_index);
    return detail::cross_entropy_cpu(p, logits.dtype());
  }
  detail::DeviceGuard guard(kOp, "logits", logits);
  detail::cross_entropy_cuda(p, logits.dtype(), detail::rows_vectorizable({lr, dr}, logits.dtype()), stream);
}

void cross_entropy_backward(const TensorView& dlogits, const TensorView& dloss, const TensorView& logits,
                            const TensorView& target, const TensorView& lse, int64_t ignore_index,
                            double label_smoothing, double z_loss, cudaStream_t stream) {
  const Rows lr = check_logits_and_target(kBackward, logits, target, label_smoothing, z_loss);
  const int64_t tokens = lr.rows, vocab = lr.d;
  const Rows dr = detail::check_like(kBackward, "dlogits", dlogits, "logits", logits);
  for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"dloss", &dloss}, {"lse", &lse}}) {
    detail::check_dtype(kBackward, name, *t, DType::f32);
    check_per_row(name, *t, logits, tokens, kBackward);
    detail::check_no_overlap(kBackward, "dlogits", dlogits, name, *t, false);
  }
  detail::check_no_overlap(kBackward, "dlogits", dlogits, "logits", logits, /*allow_identical=*/true);
  detail::check_no_overlap(kBackward, "dlogits", dlogits, "target", target, false);
  if (tokens == 0) return;
  const detail::CrossEntropyBackwardParams p{rows_params(lr, dr, target, ignore_index, label_smoothing, z_loss),
                                             static_cast<const float*>(dloss.data()),
                                             static_cast<const float*>(lse.data())};
  if (!logits.is_cuda()) {
    check_targets_in_range(target, tokens, vocab, ignore_index, kBackward);
    return detail::cross_entropy_backward_cpu(p, logits.dtype());
  }
  detail::DeviceGuard guard(kBackward, "logits", logits);
  detail::cross_entropy_backward_cuda(p, logits.dtype(), detail::rows_vectorizable({lr, dr}, logits.dtype()), stream);
}

}  // namespace llmk
