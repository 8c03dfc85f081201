"""softmax and log_softmax over the last dim with a scale, and their backwards (each its own
op). A fully masked row (all -inf) gives zeros (softmax) or -inf (log_softmax).
C++ kernels: python/src/ops_softmax.cc over include/llmk/softmax.h."""

from ._table import define, like


def _save_output(ctx, inputs, output):
    ctx.scale = inputs[1]
    ctx.save_for_backward(output)


def _softmax_grad(ctx, dy):
    (y,) = ctx.saved_tensors
    return softmax_backward(dy, y, ctx.scale), None


def _log_softmax_grad(ctx, dy):
    (y,) = ctx.saved_tensors
    return log_softmax_backward(dy, y, ctx.scale), None


define("softmax(Tensor x, float scale=1.0) -> Tensor", like, setup=_save_output, backward=_softmax_grad,
       doc="``softmax(scale * x)`` over the last dim, fp32 math, one rounding; a fully masked (all -inf) row "
           "gives zeros rather than NaN.")

define("log_softmax(Tensor x, float scale=1.0) -> Tensor", like, setup=_save_output, backward=_log_softmax_grad,
       doc="``log_softmax(scale * x)`` over the last dim; a fully masked row gives -inf.")

softmax_backward = define(
    "softmax_backward(Tensor dy, Tensor y, float scale=1.0) -> Tensor", lambda dy, y, scale: like(y),
    doc="dx of :func:`softmax` from its output ``y``: ``scale * y * (dy - sum(dy * y))``.")

log_softmax_backward = define(
    "log_softmax_backward(Tensor dy, Tensor y, float scale=1.0) -> Tensor", lambda dy, y, scale: like(y),
    doc="dx of :func:`log_softmax` from its output ``y``: ``scale * (dy - exp(y) * sum(dy))``.")
