"""Normalization ops: rmsnorm (and its rstd form), add_rmsnorm(_), rmsnorm_backward,
rmsnorm_swiglu (gated RMSNorm) and its backward, layernorm (and its statistics form) and
layernorm_backward. C++ kernels: python/src/ops_norm.cc over include/llmk/norm.h."""

from ._table import define, like, public, rows_f32, wants_grad



def _rmsnorm_setup(ctx, inputs, output):
    x, weight, ctx.eps, ctx.offset = inputs
    ctx.save_for_backward(x, weight)


def _rmsnorm_grad(ctx, dy, *unused):  # the rstd output (rmsnorm_with_rstd) is a statistic: no gradient
    x, weight = ctx.saved_tensors
    dx, dweight = rmsnorm_backward(dy, x, weight, ctx.eps, ctx.offset, None)
    return dx, dweight, None, None


_rmsnorm = define(
    "rmsnorm(Tensor x, Tensor weight, float eps=1e-06, float offset=0.0) -> Tensor", like,
    setup=_rmsnorm_setup, backward=_rmsnorm_grad, public=False)


def _rmsnorm_with_rstd_setup(ctx, inputs, output):
    _rmsnorm_setup(ctx, inputs, output)
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)  # no zeros for the statistic's gradient (a fill kernel)


_rmsnorm_with_rstd = define(
    "rmsnorm_with_rstd(Tensor x, Tensor weight, float eps=1e-06, float offset=0.0) -> (Tensor, Tensor)",
    lambda x, weight, eps, offset: (like(x), rows_f32(x)),
    setup=_rmsnorm_with_rstd_setup, backward=_rmsnorm_grad, public=False)


@public
def rmsnorm(x, weight, eps=1e-6, offset=0.0, return_rstd=False):
    """``x * rsqrt(mean(x**2, -1) + eps) * (offset + weight)`` in fp32 math, one rounding.

    ``offset=1.0`` gives Gemma's ``(1 + weight)``. With ``return_rstd`` also returns the
    per-row ``rsqrt(mean(x**2) + eps)`` as float32 of shape ``x.shape[:-1]``
    (``torch.ops.llmk.rmsnorm_with_rstd``)."""
    if return_rstd:
        return _rmsnorm_with_rstd(x, weight, eps, offset)
    return _rmsnorm(x, weight, eps, offset)


rmsnorm_backward = define(
    "rmsnorm_backward(Tensor dy, Tensor x, Tensor weight, float eps=1e-06, float offset=0.0, "
    "Tensor? dresidual=None) -> (Tensor, Tensor)",
    lambda dy, x, weight, eps, offset, dresidual: (like(x), like(weight)),
    doc="Gradients ``(dx, dweight)`` of :func:`rmsnorm`; ``dresidual`` (optional) is added to dx "
        "(the gradient flowing into add_rmsnorm's residual stream). dweight is summed in a fixed order.")


def _add_rmsnorm_setup(ctx, inputs, output):
    _, _, weight, ctx.eps, ctx.offset = inputs
    ctx.save_for_backward(output[1], weight)


def _add_rmsnorm_grad(ctx, dy, dresidual_out):
    s, weight = ctx.saved_tensors
    ds, dweight = rmsnorm_backward(dy, s, weight, ctx.eps, ctx.offset, dresidual_out)
    return ds, ds, dweight, None, None


define(
    "add_rmsnorm(Tensor x, Tensor residual, Tensor weight, float eps=1e-06, float offset=0.0) -> (Tensor, Tensor)",
    lambda x, residual, weight, eps, offset: (like(x), like(x)),
    setup=_add_rmsnorm_setup, backward=_add_rmsnorm_grad,
    doc="Fused residual add + RMSNorm, out of place: returns ``(rmsnorm(x + residual), x + residual)``. "
        "The sum is rounded to the dtype before it is normalized, exactly as the unfused "
        "``residual = x + residual; y = rmsnorm(residual)``.")

define(
    "add_rmsnorm_(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps=1e-06, float offset=0.0) -> ()",
    lambda x, residual, weight, eps, offset: None,
    doc="In place, as vLLM's ``fused_add_rms_norm``: ``residual += x; x = rmsnorm(residual)``.")


def _rmsnorm_swiglu_setup(ctx, inputs, output):
    x, gate, weight, ctx.eps, ctx.offset = inputs
    ctx.save_for_backward(x, gate, weight)


def _rmsnorm_swiglu_grad(ctx, dy):
    x, gate, weight = ctx.saved_tensors
    dx, dgate, dweight = rmsnorm_swiglu_backward(dy, x, gate, weight, ctx.eps, ctx.offset)
    return dx, dgate, dweight, None, None


define(
    "rmsnorm_swiglu(Tensor x, Tensor gate, Tensor weight, float eps=1e-06, float offset=0.0) -> Tensor",
    like, setup=_rmsnorm_swiglu_setup, backward=_rmsnorm_swiglu_grad,
    doc="Gated RMSNorm, ``rmsnorm(x, weight) * silu(gate)`` in one pass (Mamba-2's RMSNormGated with "
        "norm_before_gate, Qwen3-Next's FusedRMSNormGated): equal to ``swiglu(gate, rmsnorm(x))`` without "
        "the normalized tensor going to memory.")

rmsnorm_swiglu_backward = define(
    "rmsnorm_swiglu_backward(Tensor dy, Tensor x, Tensor gate, Tensor weight, float eps=1e-06, "
    "float offset=0.0) -> (Tensor, Tensor, Tensor)",
    lambda dy, x, gate, weight, eps, offset: (like(x), like(x), like(weight)),
    doc="Gradients ``(dx, dgate, dweight)`` of :func:`rmsnorm_swiglu`.")


def _layernorm_setup(ctx, inputs, output):
    """Both forms: layernorm's output alone, or layernorm_with_stats' (out, mean, rstd), whose
    statistics are saved for the backward to read."""
    x, weight, bias, ctx.eps = inputs
    stats = output[1:] if isinstance(output, tuple) else ()
    ctx.save_for_backward(x, weight, *stats)
    ctx.has_bias = bias is not None
    if stats:
        ctx.mark_non_differentiable(*stats)
        # The statistics' gradients stay None: materialized, they were two zero-fill kernels per
        # backward.
        ctx.set_materialize_grads(False)


def _layernorm_grad(ctx, dy, *unused):  # mean and rstd (the stats form) are statistics: no gradient
    x, weight, *stats = ctx.saved_tensors
    mean, rstd = stats or (None, None)
    dx, dweight, dbias = layernorm_backward(dy, x, weight, ctx.eps, ctx.has_bias, mean, rstd)
    return dx, dweight if weight is not None else None, dbias if ctx.has_bias else None, None


_layernorm = define(
    "layernorm(Tensor x, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> Tensor",
    like, setup=_layernorm_setup, backward=_layernorm_grad, public=False)


_layernorm_with_stats = define(
    "layernorm_with_stats(Tensor x, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) "
    "-> (Tensor, Tensor, Tensor)",
    lambda x, weight, bias, eps: (like(x), rows_f32(x), rows_f32(x)),
    setup=_layernorm_setup, backward=_layernorm_grad, public=False)


@public
def layernorm(x, weight=None, bias=None, eps=1e-5, return_stats=False):
    """LayerNorm over the last dim: ``(x - mean) * rsqrt(var + eps) * weight + bias``, fp32 math,
    one rounding; weight and bias optional (x's dtype or float32, the same when both).

    When a gradient will be taken (or with ``return_stats``, which also returns them) the
    forward writes each row's mean and rstd (float32, ``x.shape[:-1]``;
    ``torch.ops.llmk.layernorm_with_stats``) and the backward reads them instead of
    recomputing them from x."""
    if return_stats or wants_grad(x, weight, bias):
        out = _layernorm_with_stats(x, weight, bias, eps)
        return out if return_stats else out[0]
    return _layernorm(x, weight, bias, eps)


def _layernorm_backward_fake(dy, x, weight, eps, want_dbias, mean, rstd):
    dtype = weight.dtype if weight is not None else x.dtype
    d = x.shape[-1]
    return (like(x), x.new_empty(d if weight is not None else 0, dtype=dtype),
            x.new_empty(d if want_dbias else 0, dtype=dtype))


layernorm_backward = define(
    "layernorm_backward(Tensor dy, Tensor x, Tensor? weight=None, float eps=1e-05, bool want_dbias=True, "
    "Tensor? mean=None, Tensor? rstd=None) -> (Tensor, Tensor, Tensor)",
    _layernorm_backward_fake,
    doc="Gradients ``(dx, dweight, dbias)`` of :func:`layernorm`; dweight is empty without a weight, dbias "
        "without ``want_dbias``. ``mean`` and ``rstd`` (both or neither; float32, ``x.shape[:-1]``): the "
        "forward's statistics (``layernorm(..., return_stats=True)``), read instead of recomputed from x.")
