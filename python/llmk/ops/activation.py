"""Activation ops of the transformer MLP: silu_and_mul / gelu_and_mul over a fused
``[..., 2d]`` gate-and-up tensor, swiglu(gate, up) / geglu(gate, up, approximate) over two
tensors, bias_gelu, and their backwards. The GELU approximation is spelled as
``torch.nn.functional.gelu`` spells it: ``"none"`` or ``"tanh"``.
C++ kernels: python/src/ops_activation.cc over include/llmk/activation.h.

This module also keeps python/llmk's one table of activation names (ACTIVATIONS, below), which
linear's epilogue (gemm.py) and llmk.patch's gated MLPs read; the C++ op layer parses the
same strings in one place, python/src/torch_bridge.cc."""

from typing import NamedTuple, Optional

from ._table import define, like


class Activation(NamedTuple):
    """What an activation name computes, and who takes it."""
    function: Optional[str]  # "silu" or "gelu"; None: the identity
    approximate: Optional[str]  # GELU's approximation as F.gelu spells it ("none", "tanh"); None for the others
    linear: bool  # a value of linear's `activation` (its fused GEMM epilogue, C++ GemmActivation)
    model: bool  # a Hugging Face config's hidden_act of a gated MLP (llmk.patch runs it on swiglu / geglu)


# Every activation name llmk takes or maps, each once.
ACTIVATIONS = {
    "none": Activation(None, None, linear=True, model=False),
    "silu_mul": Activation("silu", None, linear=True, model=False),  # gated: see gated_width
    "gelu": Activation("gelu", "none", linear=True, model=True),
    "gelu_tanh": Activation("gelu", "tanh", linear=True, model=False),
    "silu": Activation("silu", None, linear=False, model=True),
    "swish": Activation("silu", None, linear=False, model=True),
    "gelu_pytorch_tanh": Activation("gelu", "tanh", linear=False, model=True),
    "gelu_new": Activation("gelu", "tanh", linear=False, model=True),
}
LINEAR_ACTIVATIONS = tuple(name for name, a in ACTIVATIONS.items() if a.linear)
# hidden_act -> (function, approximate)
MODEL_ACTIVATIONS = {name: (a.function, a.approximate) for name, a in ACTIVATIONS.items() if a.model}
# The gated op over (gate, up) of each function: swiglu(gate, up), geglu(gate, up, approximate).
GATED_OPS = {"silu": "swiglu", "gelu": "geglu"}
# The GELU ops' `approximate`: ("none", "tanh").
GELU_APPROXIMATIONS = tuple(dict.fromkeys(a.approximate for a in ACTIVATIONS.values() if a.approximate))


def one_of(names) -> str:
    """"'a', 'b' or 'c'": the choices in an error message."""
    quoted = [f"'{name}'" for name in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def gated_width(n):
    """The output width of a gated activation over n fused columns, the gate's first and the up
    projection's after them (silu_and_mul, gelu_and_mul, linear's 'silu_mul'): n / 2."""
    return n // 2


def _half(x, *rest):
    return x.new_empty((*x.shape[:-1], gated_width(x.shape[-1])))


def _gelu_fake(op: str, fake):
    """The fake of a GELU op, whose last argument is `approximate`: it rejects a name the C++ op
    rejects, with the op's error (so that a meta tensor gets it too), then runs `fake`."""

    def checked(*args):
        if args[-1] not in GELU_APPROXIMATIONS:
            raise RuntimeError(f"{op}: approximate must be {one_of(GELU_APPROXIMATIONS)}, got '{args[-1]}'")
        return fake(*args)

    return checked


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

define("gelu_and_mul(Tensor x, str approximate='none') -> Tensor", _gelu_fake("gelu_and_mul", _half), setup=_save_x,
       backward=_gelu_and_mul_grad,
       doc="``gelu(x[..., :d], approximate) * x[..., d:]`` (GeGLU: Gemma uses ``approximate='tanh'``).")

silu_and_mul_backward = define(
    "silu_and_mul_backward(Tensor dy, Tensor x) -> Tensor", lambda dy, x: like(x),
    doc="dx ``[..., 2d]`` of :func:`silu_and_mul`: (dgate, dup) in the layout of x.")

gelu_and_mul_backward = define(
    "gelu_and_mul_backward(Tensor dy, Tensor x, str approximate='none') -> Tensor",
    _gelu_fake("gelu_and_mul_backward", lambda dy, x, approximate: like(x)),
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


def _define_gelu_pair(name: str, first: str, second: str, doc: str, backward_doc: str):
    """geglu and bias_gelu: `name(first, second, approximate)` -> [first's shape], and its backward
    `name_backward(dy, first, second, approximate)` -> (d first, d second), which it returns."""
    backward = define(
        f"{name}_backward(Tensor dy, Tensor {first}, Tensor {second}, str approximate='none') -> (Tensor, Tensor)",
        _gelu_fake(f"{name}_backward", lambda dy, a, b, approximate: (like(a), like(b))), doc=backward_doc)
    define(f"{name}(Tensor {first}, Tensor {second}, str approximate='none') -> Tensor",
           _gelu_fake(name, lambda a, b, approximate: like(a)), setup=_save_with_approximate,
           backward=lambda ctx, dy: (*backward(dy, *ctx.saved_tensors, ctx.approximate), None), doc=doc)
    return backward


geglu_backward = _define_gelu_pair(
    "geglu", "gate", "up",
    doc="``gelu(gate, approximate) * up`` over two ``[..., d]`` tensors (Gemma's MLP, "
        "``approximate='tanh'``), fp32 math, one rounding.",
    backward_doc="Gradients ``(dgate, dup)`` of :func:`geglu`.")

bias_gelu_backward = _define_gelu_pair(
    "bias_gelu", "x", "bias",
    doc="``F.gelu(x + bias, approximate=approximate)`` in one pass (the GPT-2 / BERT MLP's bias and "
        "activation after the first projection), fp32 math, one rounding.",
    backward_doc="Gradients ``(dx, dbias)`` of :func:`bias_gelu`; dbias is summed in a fixed order.")
