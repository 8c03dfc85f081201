"""Activation ops of the transformer MLP: silu_and_mul / gelu_and_mul over a fused
``[..., 2d]`` gate-and-up tensor, swiglu(gate, up) / geglu(gate, up, approximate) over two
tensors, bias_gelu, and their backwards. The GELU approximation is spelled as
``torch.nn.functional.gelu`` spells it: ``"none"`` or ``"tanh"``.
C++ kernels: python/src/ops_activation.cc over include/llmk/activation.h."""

from ._table import define, like


def _half(x, *rest):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def _save_x(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.approximate = inputs[1] if len(inputs) > 1 else None


def _silu_and_mul_grad(ctx, dy):
    (x,) = ctx.saved_tensors
    return (silu_and_mul_backward(dy, x),)


def _gelu_and_mul_grad(ctx, dy):
    (x,) = ctx.saved_tensors
    return gelu_and_mul_backward(dy, x, ctx.approximate), None


define("silu_and_mul(Tensor x) -> Tensor", _half, setup=_save_x, backward=_silu_and_mul_grad,
       doc="``silu(x[..., :d]) * x[..., d:]`` of a fused gate-and-up projection ``[..., 2d]`` (vLLM's and "
           "FlashInfer's layout); returns ``[..., d]``.")

define("gelu_and_mul(Tensor x, str approximate='none') -> Tensor", _half, setup=_save_x,
       backward=_gelu_and_mul_grad,
       doc="``gelu(x[..., :d], approximate) * x[..., d:]`` (GeGLU: Gemma uses ``approximate='tanh'``).")

silu_and_mul_backward = define(
    "silu_and_mul_backward(Tensor dy, Tensor x) -> Tensor", lambda dy, x: like(x),
    doc="dx ``[..., 2d]`` of :func:`silu_and_mul`: (dgate, dup) in the layout of x.")

gelu_and_mul_backward = define(
    "gelu_and_mul_backward(Tensor dy, Tensor x, str approximate='none') -> Tensor",
    lambda dy, x, approximate: like(x),
    doc="dx ``[..., 2d]`` of :func:`gelu_and_mul`: (dgate, dup) in the layout of x.")


def _save_with_approximate(ctx, inputs, output):
    """geglu, bias_gelu: saves the two tensor inputs; the last input is the GELU approximation."""
    *tensors, ctx.approximate = inputs
    ctx.save_for_backward(*tensors)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _swiglu_grad(ctx, dy):
    gate, up = ctx.saved_tensors
    return swiglu_backward(dy, gate, up)


define("swiglu(Tensor gate, Tensor up) -> Tensor", lambda gate, up: like(gate), setup=_swiglu_setup,
       backward=_swiglu_grad, doc="``silu(gate) * up`` over two ``[..., d]`` tensors, fp32 math, one rounding.")

swiglu_backward = define(
    "swiglu_backward(Tensor dy, Tensor gate, Tensor up) -> (Tensor, Tensor)",
    lambda dy, gate, up: (like(gate), like(up)), doc="Gradients ``(dgate, dup)`` of :func:`swiglu`.")


def _geglu_grad(ctx, dy):
    return (*geglu_backward(dy, *ctx.saved_tensors, ctx.approximate), None)


define("geglu(Tensor gate, Tensor up, str approximate='none') -> Tensor",
       lambda gate, up, approximate: like(gate), setup=_save_with_approximate, backward=_geglu_grad,
       doc="``gelu(gate, approximate) * up`` over two ``[..., d]`` tensors (Gemma's MLP, "
           "``approximate='tanh'``), fp32 math, one rounding.")

geglu_backward = define(
    "geglu_backward(Tensor dy, Tensor gate, Tensor up, str approximate='none') -> (Tensor, Tensor)",
    lambda dy, gate, up, approximate: (like(gate), like(up)), doc="Gradients ``(dgate, dup)`` of :func:`geglu`.")


def _bias_gelu_grad(ctx, dy):
    return (*bias_gelu_backward(dy, *ctx.saved_tensors, ctx.approximate), None)


define("bias_gelu(Tensor x, Tensor bias, str approximate='none') -> Tensor", lambda x, bias, approximate: like(x),
       setup=_save_with_approximate, backward=_bias_gelu_grad,
       doc="``F.gelu(x + bias, approximate=approximate)`` in one pass (the GPT-2 / BERT MLP's bias and "
           "activation after the first projection), fp32 math, one rounding.")

bias_gelu_backward = define(
    "bias_gelu_backward(Tensor dy, Tensor x, Tensor bias, str approximate='none') -> (Tensor, Tensor)",
    lambda dy, x, bias, approximate: (like(x), like(bias)),
    doc="Gradients ``(dx, dbias)`` of :func:`bias_gelu`; dbias is summed in a fixed order.")
