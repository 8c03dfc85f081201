"""Cross-entropy over vocabulary logits: per-row loss and log-sum-exp in one pass over the
logits, the gradient in one more (cross_entropy_backward, from the forward's lse), and the
public cross_entropy with PyTorch's reductions. C++ kernels: python/src/ops_loss.cc over include/llmk/loss.h (its
header comment has the formulas: ignore_index, label smoothing, z-loss)."""

from torch import Tensor

from ._table import define, public, rows_f32

_ARGS = "int ignore_index=-100, float label_smoothing=0.0, float z_loss=0.0"



def _setup(ctx, inputs, output):
    logits, target, *ctx.args = inputs
    ctx.save_for_backward(logits, target, output[1])
    ctx.mark_non_differentiable(output[1])


def _grad(ctx, dloss, dlse):
    logits, target, lse = ctx.saved_tensors
    return (cross_entropy_backward(dloss, logits, target, lse, *ctx.args), None) + (None,) * len(ctx.args)


_cross_entropy = define(
    f"cross_entropy(Tensor logits, Tensor target, {_ARGS}) -> (Tensor, Tensor)",
    lambda logits, target, *args: (rows_f32(logits), rows_f32(logits)),
    setup=_setup, backward=_grad, public=False)

cross_entropy_backward = define(
    f"cross_entropy_backward(Tensor dloss, Tensor logits, Tensor target, Tensor lse, {_ARGS}) -> Tensor",
    lambda dloss, logits, *args: logits.new_empty(logits.shape),
    doc="The gradient of the logits from the rows' upstream gradient ``dloss`` (float32 [tokens]) and the "
        "forward's ``lse``: one pass over the logits, zero on ignored rows.")

_REDUCTIONS = ("none", "sum", "mean")


@public
def cross_entropy(logits: Tensor, target: Tensor, ignore_index: int = -100, label_smoothing: float = 0.0,
                  reduction: str = "mean", z_loss: float = 0.0, return_lse: bool = False):
    """``torch.nn.functional.cross_entropy(logits, target, ignore_index=..., label_smoothing=...,
    reduction=...)`` over logits ``[..., vocab]`` (float32, float16, bfloat16; fp32 math) and
    int64/int32 targets ``[...]``, plus ``z_loss * lse**2`` per row (PaLM's z-loss); with
    autograd. The loss is float32 whatever the logits' dtype. ``reduction="mean"`` averages
    over the rows not ignored (NaN when all are, as PyTorch). With ``return_lse`` also returns
    the per-row float32 log-sum-exp. On the GPU a target out of range gives that row a NaN
    loss (checking would need a sync); on the CPU it raises."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"llmk.cross_entropy: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    vocab = logits.shape[-1]
    loss, lse = _cross_entropy(logits.reshape(-1, vocab), target.reshape(-1), ignore_index, label_smoothing, z_loss)
    if reduction == "none":
        loss = loss.view(target.shape)
    elif reduction == "sum":
        loss = loss.sum()
    else:
        loss = loss.sum() / (target != ignore_index).sum()
    return (loss, lse.view(target.shape)) if return_lse else loss
