"""torch.library registration of the llmk ops: ``torch.ops.llmk.*``.

Each op allocates its outputs with torch (the caching allocator), hands the tensors to the
C++ API through DLPack together with the current CUDA stream, and has a fake
implementation so that ``torch.compile(fullgraph=True)`` traces through it.
"""

import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _C


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _rows_shape(x: Tensor):
    return x.shape[:-1]


# --------------------------------------------------------------------------------------
# rmsnorm


def _workspace(size_fn, x: Tensor) -> Optional[Tensor]:
    """The f32 workspace a backward over x's rows needs, sized by `size_fn(rows, d, device)`
    (one of _C's *_workspace_size); None on the CPU."""
    if not x.is_cuda:
        return None
    size = size_fn(_rows_shape(x).numel(), x.shape[-1], x.device.index or 0)
    return torch.empty(max(size, 1), dtype=torch.float32, device=x.device)


@torch.library.custom_op("llmk::rmsnorm", mutates_args=())
def _rmsnorm(x: Tensor, weight: Tensor, eps: float, offset: float) -> Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _C.rmsnorm(out, x, weight, eps, offset, None, _stream(x))
    return out


@_rmsnorm.register_fake
def _(x, weight, eps, offset):
    return x.new_empty(x.shape)


@torch.library.custom_op("llmk::rmsnorm_with_rstd", mutates_args=())
def _rmsnorm_with_rstd(x: Tensor, weight: Tensor, eps: float, offset: float) -> Tuple[Tensor, Tensor]:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rstd = torch.empty(_rows_shape(x).numel(), dtype=torch.float32, device=x.device)
    _C.rmsnorm(out, x, weight, eps, offset, rstd, _stream(x))
    return out, rstd.view(_rows_shape(x))


@_rmsnorm_with_rstd.register_fake
def _(x, weight, eps, offset):
    return x.new_empty(x.shape), x.new_empty(_rows_shape(x), dtype=torch.float32)


@torch.library.custom_op("llmk::rmsnorm_backward", mutates_args=())
def _rmsnorm_backward(
    dy: Tensor, x: Tensor, weight: Tensor, eps: float, offset: float, dresidual: Optional[Tensor]
) -> Tuple[Tensor, Tensor]:
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dweight = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)
    _C.rmsnorm_backward(dx, dweight, dy, x, weight, eps, offset, dresidual,
                        _workspace(_C.rmsnorm_backward_workspace_size, x), _stream(x))
    return dx, dweight


@_rmsnorm_backward.register_fake
def _(dy, x, weight, eps, offset, dresidual):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _dense_rows(t: Tensor) -> Tensor:
    """Gradients can arrive with any layout (expanded, transposed); the kernels take rows."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _rmsnorm_setup(ctx, inputs, output):
    x, weight, eps, offset = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps, ctx.offset = eps, offset


def _rmsnorm_grad(ctx, dy):
    x, weight = ctx.saved_tensors
    dx, dweight = torch.ops.llmk.rmsnorm_backward(_dense_rows(dy), x, weight, ctx.eps, ctx.offset, None)
    return dx, dweight, None, None


_rmsnorm.register_autograd(_rmsnorm_grad, setup_context=_rmsnorm_setup)


def _rmsnorm_with_rstd_grad(ctx, dy, drstd):
    # rstd is an auxiliary output; gradients through it are not supported (it is a
    # statistic for the caller's own backward), so drstd is ignored.
    return _rmsnorm_grad(ctx, dy)


_rmsnorm_with_rstd.register_autograd(_rmsnorm_with_rstd_grad, setup_context=_rmsnorm_setup)


def rmsnorm(x: Tensor, weight: Tensor, eps: float = 1e-6, offset: float = 0.0, return_rstd: bool = False):
    """``x * rsqrt(mean(x**2, -1) + eps) * (offset + weight)`` in fp32 math, one rounding.

    ``offset=1.0`` gives Gemma's ``(1 + weight)``. With ``return_rstd`` also returns the
    per-row ``rsqrt(mean(x**2) + eps)`` as float32 of shape ``x.shape[:-1]``.
    """
    if return_rstd:
        return torch.ops.llmk.rmsnorm_with_rstd(x, weight, eps, offset)
    return torch.ops.llmk.rmsnorm(x, weight, eps, offset)


def rmsnorm_backward(dy: Tensor, x: Tensor, weight: Tensor, eps: float = 1e-6, offset: float = 0.0,
                     dresidual: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Gradients ``(dx, dweight)`` of :func:`rmsnorm`; ``dresidual`` (optional) is added to dx."""
    return torch.ops.llmk.rmsnorm_backward(dy, x, weight, eps, offset, dresidual)


# --------------------------------------------------------------------------------------
# rmsnorm_swiglu (gated RMSNorm)


@torch.library.custom_op("llmk::rmsnorm_swiglu", mutates_args=())
def _rmsnorm_swiglu(x: Tensor, gate: Tensor, weight: Tensor, eps: float, offset: float) -> Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _C.rmsnorm_swiglu(out, x, gate, weight, eps, offset, _stream(x))
    return out


@_rmsnorm_swiglu.register_fake
def _(x, gate, weight, eps, offset):
    return x.new_empty(x.shape)


@torch.library.custom_op("llmk::rmsnorm_swiglu_backward", mutates_args=())
def _rmsnorm_swiglu_backward(dy: Tensor, x: Tensor, gate: Tensor, weight: Tensor, eps: float,
                             offset: float) -> Tuple[Tensor, Tensor, Tensor]:
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dgate = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dweight = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)
    _C.rmsnorm_swiglu_backward(dx, dgate, dweight, dy, x, gate, weight, eps, offset,
                               _workspace(_C.rmsnorm_backward_workspace_size, x), _stream(x))
    return dx, dgate, dweight


@_rmsnorm_swiglu_backward.register_fake
def _(dy, x, gate, weight, eps, offset):
    return x.new_empty(x.shape), x.new_empty(x.shape), weight.new_empty(weight.shape)


def _rmsnorm_swiglu_setup(ctx, inputs, output):
    x, gate, weight, ctx.eps, ctx.offset = inputs
    ctx.save_for_backward(x, gate, weight)


def _rmsnorm_swiglu_grad(ctx, dy):
    x, gate, weight = ctx.saved_tensors
    dx, dgate, dweight = torch.ops.llmk.rmsnorm_swiglu_backward(_dense_rows(dy), x, gate, weight, ctx.eps,
                                                                ctx.offset)
    return dx, dgate, dweight, None, None


_rmsnorm_swiglu.register_autograd(_rmsnorm_swiglu_grad, setup_context=_rmsnorm_swiglu_setup)


def rmsnorm_swiglu(x: Tensor, gate: Tensor, weight: Tensor, eps: float = 1e-6, offset: float = 0.0) -> Tensor:
    """Gated RMSNorm, ``rmsnorm(x, weight) * silu(gate)`` in one pass (Mamba-2's RMSNormGated with
    norm_before_gate, Qwen3-Next's FusedRMSNormGated): equal to ``swiglu(gate, rmsnorm(x))``
    without the normalized tensor going to memory."""
    return torch.ops.llmk.rmsnorm_swiglu(x, gate, weight, eps, offset)


def rmsnorm_swiglu_backward(dy: Tensor, x: Tensor, gate: Tensor, weight: Tensor, eps: float = 1e-6,
                            offset: float = 0.0) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients ``(dx, dgate, dweight)`` of :func:`rmsnorm_swiglu`."""
    return torch.ops.llmk.rmsnorm_swiglu_backward(dy, x, gate, weight, eps, offset)


# --------------------------------------------------------------------------------------
# add_rmsnorm


@torch.library.custom_op("llmk::add_rmsnorm", mutates_args=())
def _add_rmsnorm(x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float) -> Tuple[Tensor, Tensor]:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    residual_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _C.add_rmsnorm(out, residual_out, x, residual, weight, eps, offset, _stream(x))
    return out, residual_out


@_add_rmsnorm.register_fake
def _(x, residual, weight, eps, offset):
    return x.new_empty(x.shape), x.new_empty(x.shape)


def _add_rmsnorm_setup(ctx, inputs, output):
    _, _, weight, eps, offset = inputs
    ctx.save_for_backward(output[1], weight)
    ctx.eps, ctx.offset = eps, offset


def _add_rmsnorm_grad(ctx, dy, dresidual_out):
    s, weight = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(s)
    dres = None if dresidual_out is None else _dense_rows(dresidual_out)
    ds, dweight = torch.ops.llmk.rmsnorm_backward(_dense_rows(dy), s, weight, ctx.eps, ctx.offset, dres)
    return ds, ds, dweight, None, None


_add_rmsnorm.register_autograd(_add_rmsnorm_grad, setup_context=_add_rmsnorm_setup)


@torch.library.custom_op("llmk::add_rmsnorm_", mutates_args=("x", "residual"))
def _add_rmsnorm_inplace(x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float) -> None:
    _C.add_rmsnorm(x, residual, x, residual, weight, eps, offset, _stream(x))


@_add_rmsnorm_inplace.register_fake
def _(x, residual, weight, eps, offset):
    return None


def add_rmsnorm(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6, offset: float = 0.0):
    """Fused residual add + RMSNorm, out of place: returns ``(rmsnorm(x + residual), x + residual)``.

    The sum is rounded to the dtype before it is normalized, exactly as the unfused
    ``residual = x + residual; y = rmsnorm(residual)``.
    """
    return torch.ops.llmk.add_rmsnorm(x, residual, weight, eps, offset)


def add_rmsnorm_(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6, offset: float = 0.0) -> None:
    """In place, as vLLM's ``fused_add_rms_norm``: ``residual += x; x = rmsnorm(residual)``."""
    torch.ops.llmk.add_rmsnorm_(x, residual, weight, eps, offset)


# --------------------------------------------------------------------------------------
# layernorm


@torch.library.custom_op("llmk::layernorm", mutates_args=())
def _layernorm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float) -> Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _C.layernorm(out, x, weight, bias, eps, None, None, _stream(x))
    return out


@_layernorm.register_fake
def _(x, weight, bias, eps):
    return x.new_empty(x.shape)


@torch.library.custom_op("llmk::layernorm_backward", mutates_args=())
def _layernorm_backward(dy: Tensor, x: Tensor, weight: Optional[Tensor], eps: float,
                        want_dbias: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias); dweight is empty ([0]) without a weight, dbias without want_dbias."""
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    param_dtype = weight.dtype if weight is not None else x.dtype
    d = x.shape[-1]
    dweight = torch.empty(d if weight is not None else 0, dtype=param_dtype, device=x.device)
    dbias = torch.empty(d if want_dbias else 0, dtype=param_dtype, device=x.device)
    _C.layernorm_backward(dx, dweight if weight is not None else None, dbias if want_dbias else None,
                          dy, x, weight, eps, _workspace(_C.layernorm_backward_workspace_size, x), _stream(x))
    return dx, dweight, dbias


@_layernorm_backward.register_fake
def _(dy, x, weight, eps, want_dbias):
    param_dtype = weight.dtype if weight is not None else x.dtype
    d = x.shape[-1]
    return (x.new_empty(x.shape), x.new_empty(d if weight is not None else 0, dtype=param_dtype),
            x.new_empty(d if want_dbias else 0, dtype=param_dtype))


def _layernorm_setup(ctx, inputs, output):
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps, ctx.has_bias = eps, bias is not None


def _layernorm_grad(ctx, dy):
    x, weight = ctx.saved_tensors
    dx, dweight, dbias = torch.ops.llmk.layernorm_backward(_dense_rows(dy), x, weight, ctx.eps, ctx.has_bias)
    return dx, dweight if weight is not None else None, dbias if ctx.has_bias else None, None


_layernorm.register_autograd(_layernorm_grad, setup_context=_layernorm_setup)


def layernorm(x: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tensor:
    """LayerNorm over the last dim: ``(x - mean) * rsqrt(var + eps) * weight + bias``, fp32
    math, one rounding; weight and bias optional (x's dtype or float32, the same when both)."""
    return torch.ops.llmk.layernorm(x, weight, bias, eps)


def layernorm_backward(dy: Tensor, x: Tensor, weight: Optional[Tensor] = None, eps: float = 1e-5,
                       want_dbias: bool = True):
    """Gradients ``(dx, dweight, dbias)`` of :func:`layernorm` (empty tensors for the absent ones)."""
    return torch.ops.llmk.layernorm_backward(dy, x, weight, eps, want_dbias)


# --------------------------------------------------------------------------------------
# gated activations: silu_and_mul, gelu_and_mul (x = [..., 2d], gate then up), swiglu


def _half_shape(x: Tensor):
    return (*x.shape[:-1], x.shape[-1] // 2)


@torch.library.custom_op("llmk::silu_and_mul", mutates_args=())
def _silu_and_mul(x: Tensor) -> Tensor:
    out = torch.empty(_half_shape(x), dtype=x.dtype, device=x.device)
    _C.silu_and_mul(out, x, _stream(x))
    return out


@_silu_and_mul.register_fake
def _(x):
    return x.new_empty(_half_shape(x))


@torch.library.custom_op("llmk::gelu_and_mul", mutates_args=())
def _gelu_and_mul(x: Tensor, approximate: str) -> Tensor:
    out = torch.empty(_half_shape(x), dtype=x.dtype, device=x.device)
    _C.gelu_and_mul(out, x, approximate, _stream(x))
    return out


@_gelu_and_mul.register_fake
def _(x, approximate):
    return x.new_empty(_half_shape(x))


@torch.library.custom_op("llmk::gated_and_mul_backward", mutates_args=())
def _gated_and_mul_backward(dy: Tensor, x: Tensor, activation: str) -> Tensor:
    """dx of silu_and_mul (activation "silu") or gelu_and_mul ("gelu", "gelu_tanh")."""
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if activation == "silu":
        _C.silu_and_mul_backward(dx, dy, x, _stream(x))
    else:
        _C.gelu_and_mul_backward(dx, dy, x, "tanh" if activation == "gelu_tanh" else "none", _stream(x))
    return dx


@_gated_and_mul_backward.register_fake
def _(dy, x, activation):
    return x.new_empty(x.shape)


def _silu_and_mul_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.activation = "silu"


def _gelu_and_mul_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.activation = "gelu_tanh" if inputs[1] == "tanh" else "gelu"


def _gated_and_mul_grad(ctx, dy):
    (x,) = ctx.saved_tensors
    dx = torch.ops.llmk.gated_and_mul_backward(_dense_rows(dy), x, ctx.activation)
    return (dx,) if ctx.activation == "silu" else (dx, None)


_silu_and_mul.register_autograd(_gated_and_mul_grad, setup_context=_silu_and_mul_setup)
_gelu_and_mul.register_autograd(_gated_and_mul_grad, setup_context=_gelu_and_mul_setup)


@torch.library.custom_op("llmk::swiglu", mutates_args=())
def _swiglu(gate: Tensor, up: Tensor) -> Tensor:
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    _C.swiglu(out, gate, up, _stream(gate))
    return out


@_swiglu.register_fake
def _(gate, up):
    return gate.new_empty(gate.shape)


@torch.library.custom_op("llmk::swiglu_backward", mutates_args=())
def _swiglu_backward(dy: Tensor, gate: Tensor, up: Tensor) -> Tuple[Tensor, Tensor]:
    dgate = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    dup = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    _C.swiglu_backward(dgate, dup, dy, gate, up, _stream(gate))
    return dgate, dup


@_swiglu_backward.register_fake
def _(dy, gate, up):
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _swiglu_grad(ctx, dy):
    gate, up = ctx.saved_tensors
    return torch.ops.llmk.swiglu_backward(_dense_rows(dy), gate, up)


_swiglu.register_autograd(_swiglu_grad, setup_context=_swiglu_setup)


def silu_and_mul(x: Tensor) -> Tensor:
    """SwiGLU over a fused gate-and-up projection ``x = [..., 2d]``: ``silu(x[..., :d]) * x[..., d:]``,
    fp32 math, one rounding (vLLM's and FlashInfer's ``silu_and_mul``)."""
    return torch.ops.llmk.silu_and_mul(x)


def gelu_and_mul(x: Tensor, approximate: str = "none") -> Tensor:
    """GeGLU: ``gelu(x[..., :d], approximate) * x[..., d:]``; approximate is "none" (erf) or "tanh"."""
    return torch.ops.llmk.gelu_and_mul(x, approximate)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """``silu(gate) * up`` for separate gate and up tensors of one shape."""
    return torch.ops.llmk.swiglu(gate, up)


def silu_and_mul_backward(dy: Tensor, x: Tensor) -> Tensor:
    """dx (``[..., 2d]``: dgate then dup) of :func:`silu_and_mul`."""
    return torch.ops.llmk.gated_and_mul_backward(dy, x, "silu")


def gelu_and_mul_backward(dy: Tensor, x: Tensor, approximate: str = "none") -> Tensor:
    """dx of :func:`gelu_and_mul`."""
    return torch.ops.llmk.gated_and_mul_backward(dy, x, "gelu_tanh" if approximate == "tanh" else "gelu")


def swiglu_backward(dy: Tensor, gate: Tensor, up: Tensor) -> Tuple[Tensor, Tensor]:
    """``(dgate, dup)`` of :func:`swiglu`."""
    return torch.ops.llmk.swiglu_backward(dy, gate, up)


# --------------------------------------------------------------------------------------
# bias_gelu


@torch.library.custom_op("llmk::bias_gelu", mutates_args=())
def _bias_gelu(x: Tensor, bias: Tensor, approximate: str) -> Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _C.bias_gelu(out, x, bias, approximate, _stream(x))
    return out


@_bias_gelu.register_fake
def _(x, bias, approximate):
    return x.new_empty(x.shape)


@torch.library.custom_op("llmk::bias_gelu_backward", mutates_args=())
def _bias_gelu_backward(dy: Tensor, x: Tensor, bias: Tensor, approximate: str) -> Tuple[Tensor, Tensor]:
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dbias = torch.empty(bias.shape, dtype=bias.dtype, device=bias.device)
    _C.bias_gelu_backward(dx, dbias, dy, x, bias, approximate, _workspace(_C.bias_gelu_backward_workspace_size, x),
                          _stream(x))
    return dx, dbias


@_bias_gelu_backward.register_fake
def _(dy, x, bias, approximate):
    return x.new_empty(x.shape), bias.new_empty(bias.shape)


def _bias_gelu_setup(ctx, inputs, output):
    x, bias, ctx.approximate = inputs
    ctx.save_for_backward(x, bias)


def _bias_gelu_grad(ctx, dy):
    x, bias = ctx.saved_tensors
    dx, dbias = torch.ops.llmk.bias_gelu_backward(_dense_rows(dy), x, bias, ctx.approximate)
    return dx, dbias, None


_bias_gelu.register_autograd(_bias_gelu_grad, setup_context=_bias_gelu_setup)


def bias_gelu(x: Tensor, bias: Tensor, approximate: str = "none") -> Tensor:
    """``F.gelu(x + bias, approximate=approximate)`` in one pass (the GPT-2 / BERT MLP's bias
    and activation after the first projection), fp32 math, one rounding."""
    return torch.ops.llmk.bias_gelu(x, bias, approximate)


def bias_gelu_backward(dy: Tensor, x: Tensor, bias: Tensor, approximate: str = "none") -> Tuple[Tensor, Tensor]:
    """Gradients ``(dx, dbias)`` of :func:`bias_gelu`; dbias is summed in a fixed order."""
    return torch.ops.llmk.bias_gelu_backward(dy, x, bias, approximate)


# --------------------------------------------------------------------------------------
# softmax, log_softmax


@torch.library.custom_op("llmk::softmax", mutates_args=())
def _softmax(x: Tensor, scale: float, log: bool) -> Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _C.softmax(out, x, scale, log, _stream(x))
    return out


@_softmax.register_fake
def _(x, scale, log):
    return x.new_empty(x.shape)


@torch.library.custom_op("llmk::softmax_backward", mutates_args=())
def _softmax_backward(dy: Tensor, y: Tensor, scale: float, log: bool) -> Tensor:
    dx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    _C.softmax_backward(dx, dy, y, scale, log, _stream(y))
    return dx


@_softmax_backward.register_fake
def _(dy, y, scale, log):
    return y.new_empty(y.shape)


def _softmax_setup(ctx, inputs, output):
    _, ctx.scale, ctx.log = inputs
    ctx.save_for_backward(output)


def _softmax_grad(ctx, dy):
    (y,) = ctx.saved_tensors
    return torch.ops.llmk.softmax_backward(_dense_rows(dy), y, ctx.scale, ctx.log), None, None


_softmax.register_autograd(_softmax_grad, setup_context=_softmax_setup)


def softmax(x: Tensor, scale: float = 1.0) -> Tensor:
    """``softmax(scale * x)`` over the last dim, fp32 math, one rounding. A row that is all
    -inf (fully masked) gives zeros rather than NaN."""
    return torch.ops.llmk.softmax(x, scale, False)


def log_softmax(x: Tensor, scale: float = 1.0) -> Tensor:
    """``log_softmax(scale * x)`` over the last dim; a fully masked row gives -inf."""
    return torch.ops.llmk.softmax(x, scale, True)


def softmax_backward(dy: Tensor, y: Tensor, scale: float = 1.0) -> Tensor:
    """dx of :func:`softmax` from its output ``y``: ``scale * y * (dy - sum(dy * y))``."""
    return torch.ops.llmk.softmax_backward(dy, y, scale, False)


def log_softmax_backward(dy: Tensor, y: Tensor, scale: float = 1.0) -> Tensor:
    """dx of :func:`log_softmax` from its output ``y``: ``scale * (dy - exp(y) * sum(dy))``."""
    return torch.ops.llmk.softmax_backward(dy, y, scale, True)


# --------------------------------------------------------------------------------------
# RoPE


_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _llama3_list(llama3_scaling: Optional[dict]) -> Optional[List[float]]:
    if llama3_scaling is None:
        return None
    missing = [key for key in _LLAMA3_KEYS if key not in llama3_scaling]
    if missing:
        raise ValueError(f"llama3_scaling lacks {missing} (Hugging Face's rope_scaling keys)")
    return [float(llama3_scaling[key]) for key in _LLAMA3_KEYS]


@torch.library.custom_op("llmk::rope_", mutates_args=("q", "k"))
def _rope_inplace(q: Tensor, k: Optional[Tensor], positions: Tensor, cos_sin_cache: Optional[Tensor],
                  theta: float, rot_dim: int, style: str, llama3: Optional[List[float]], inverse: bool) -> None:
    _C.rope(q, k, positions, cos_sin_cache, theta, rot_dim, style, llama3, inverse, _stream(q))


@_rope_inplace.register_fake
def _(q, k, positions, cos_sin_cache, theta, rot_dim, style, llama3, inverse):
    return None


@torch.library.custom_op("llmk::rope", mutates_args=())
def _rope(x: Tensor, positions: Tensor, cos_sin_cache: Optional[Tensor], theta: float, rot_dim: int,
          style: str, llama3: Optional[List[float]], inverse: bool) -> Tensor:
    out = x.clone(memory_format=torch.contiguous_format)
    _C.rope(out, None, positions, cos_sin_cache, theta, rot_dim, style, llama3, inverse, _stream(x))
    return out


@_rope.register_fake
def _(x, positions, cos_sin_cache, theta, rot_dim, style, llama3, inverse):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _rope_setup(ctx, inputs, output):
    _, positions, cache, ctx.theta, ctx.rot_dim, ctx.style, ctx.llama3, ctx.inverse = inputs
    ctx.save_for_backward(positions, cache)


def _rope_grad(ctx, dy):
    positions, cache = ctx.saved_tensors
    dx = torch.ops.llmk.rope(dy, positions, cache, ctx.theta, ctx.rot_dim, ctx.style, ctx.llama3,
                             not ctx.inverse)
    return dx, None, None, None, None, None, None, None


_rope.register_autograd(_rope_grad, setup_context=_rope_setup)


def rope_(q: Tensor, k: Optional[Tensor], positions: Tensor, cos_sin_cache: Optional[Tensor] = None, *,
          theta: float = 10000.0, rot_dim: Optional[int] = None, style: str = "neox",
          llama3_scaling: Optional[dict] = None, inverse: bool = False) -> None:
    """Rotary position embedding in place on ``q`` and ``k`` (one launch).

    q: ``[tokens, heads_q, head_dim]`` or ``[batch, seq, heads_q, head_dim]`` (any strides with a
    contiguous last dim, e.g. head slices of a fused qkv tensor); k: the same leading dims and
    head_dim with its own head count, or None. positions: int32/int64 with q's leading dims
    (``[seq]`` broadcasts over the batch). The angles come from ``cos_sin_cache`` (float32
    ``[max_pos, rot_dim]``, cos then sin: vLLM's layout) or from ``theta`` over ``rot_dim``
    (default head_dim) with optional Llama 3.1 ``llama3_scaling`` (Hugging Face's rope_scaling
    dict). style: ``"neox"`` (rotate halves) or ``"gptj"`` (interleaved pairs). ``inverse``
    applies the inverse rotation (the backward). On the GPU a position outside the cache gives
    NaN for that token; on the CPU it raises."""
    torch.ops.llmk.rope_(q, k, positions, cos_sin_cache, float(theta), int(rot_dim or 0), style,
                         _llama3_list(llama3_scaling), bool(inverse))


def rope(q: Tensor, k: Optional[Tensor], positions: Tensor, cos_sin_cache: Optional[Tensor] = None, *,
         theta: float = 10000.0, rot_dim: Optional[int] = None, style: str = "neox",
         llama3_scaling: Optional[dict] = None):
    """Out-of-place, differentiable :func:`rope_`: returns the rotated ``(q, k)`` (k None when
    not given) as new contiguous tensors; their gradient is the inverse rotation."""
    args = (positions, cos_sin_cache, float(theta), int(rot_dim or 0), style, _llama3_list(llama3_scaling), False)
    q_out = torch.ops.llmk.rope(q, *args)
    return q_out, (torch.ops.llmk.rope(k, *args) if k is not None else None)


def rope_cos_sin_cache(max_position: int, rot_dim: int, theta: float = 10000.0,
                       llama3_scaling: Optional[dict] = None, device=None) -> Tensor:
    """The float32 ``[max_position, rot_dim]`` cos/sin cache of :func:`rope_`, computed in float64."""
    i = torch.arange(0, rot_dim // 2, dtype=torch.float64)
    inv_freq = theta ** (-2.0 * i / rot_dim)
    if llama3_scaling is not None:
        factor, low, high, original = _llama3_list(llama3_scaling)
        wavelen = 2 * math.pi / inv_freq
        smooth = (original / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
        medium = (wavelen >= original / high) & (wavelen <= original / low)
        inv_freq = torch.where(medium, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    angles = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(torch.float32).to(device)


# --------------------------------------------------------------------------------------
# fused AdamW (the optimizer class is llmk.optim.AdamW)


@torch.library.custom_op("llmk::adamw_step_", mutates_args=("params", "exp_avgs", "exp_avg_sqs"))
def _adamw_step(params: List[Tensor], grads: List[Tensor], exp_avgs: List[Tensor], exp_avg_sqs: List[Tensor],
                steps: List[Tensor], lr: float, lr_tensor: Optional[Tensor], beta1: float, beta2: float,
                eps: float, weight_decay: float, maximize: bool) -> None:
    stream = _stream(params[0]) if params else 0
    _C.adamw_step(params, grads, exp_avgs, exp_avg_sqs, steps, lr, lr_tensor, beta1, beta2, eps, weight_decay,
                  maximize, stream)


@_adamw_step.register_fake
def _(params, grads, exp_avgs, exp_avg_sqs, steps, lr, lr_tensor, beta1, beta2, eps, weight_decay, maximize):
    return None


# --------------------------------------------------------------------------------------
# attention forward (FlashAttention 2's algorithm; the backward is a later issue)


def _no_attention_backward(ctx, *grads):
    raise NotImplementedError(
        "llmk attention: the backward pass is not implemented yet (forward only); for training use "
        "torch.nn.functional.scaled_dot_product_attention")


def _no_setup(ctx, inputs, output):
    pass


def _attention_lse(q: Tensor, want: bool) -> Tensor:
    """The float32 lse output of q's attention, [batch, heads, seq_q] (varlen q [total, heads,
    dim]: [heads, total]); an empty tensor when not wanted."""
    shape = (q.shape[1], q.shape[0]) if q.dim() == 3 else (q.shape[0], q.shape[2], q.shape[1])
    return torch.empty(shape if want else (0,), dtype=torch.float32, device=q.device)


@torch.library.custom_op("llmk::attention", mutates_args=())
def _attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, return_lse: bool) -> Tuple[Tensor, Tensor]:
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = _attention_lse(q, return_lse)
    _C.attention(out, q, k, v, lse if return_lse else None, scale, causal, _stream(q))
    return out, lse


@_attention.register_fake
def _(q, k, v, causal, scale, return_lse):
    return q.new_empty(q.shape), _attention_lse(q, return_lse)


_attention.register_autograd(_no_attention_backward, setup_context=_no_setup)


@torch.library.custom_op("llmk::attention_varlen", mutates_args=())
def _attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                      max_seqlen_k: int, causal: bool, scale: float, return_lse: bool) -> Tuple[Tensor, Tensor]:
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = _attention_lse(q, return_lse)
    _C.attention_varlen(out, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        lse if return_lse else None, scale, causal, _stream(q))
    return out, lse


@_attention_varlen.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, return_lse):
    return q.new_empty(q.shape), _attention_lse(q, return_lse)


_attention_varlen.register_autograd(_no_attention_backward, setup_context=_no_setup)


def _scale_or_default(scale: Optional[float], head_dim: int) -> float:
    return float(scale) if scale is not None else 1.0 / math.sqrt(head_dim)


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale: Optional[float] = None,
              return_lse: bool = False):
    """softmax(scale * q k^T) v over ``[batch, seq, heads, head_dim]`` q and k/v (FlashAttention's
    layout; heads_q a multiple of heads_kv for GQA/MQA), fp16 or bf16, head_dim 32/64/96/128/256.
    ``causal`` aligns the mask to the bottom-right corner when seq_q != seq_k (FlashAttention 2);
    rows that see no key give 0 (lse -inf). ``scale`` defaults to 1/sqrt(head_dim). Returns out,
    or ``(out, lse)`` with lse float32 ``[batch, heads_q, seq_q]``. Forward only."""
    out, lse = torch.ops.llmk.attention(q, k, v, causal, _scale_or_default(scale, q.shape[-1]), return_lse)
    return (out, lse) if return_lse else out


def attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                     max_seqlen_k: int, causal: bool = False, scale: Optional[float] = None,
                     return_lse: bool = False):
    """:func:`attention` over packed variable-length sequences (FlashAttention's varlen API):
    q ``[total_q, heads_q, head_dim]``, k/v ``[total_k, heads_kv, head_dim]``, int32 prefix sums
    ``cu_seqlens_q``/``cu_seqlens_k`` of ``batch + 1`` entries, and the longest lengths. On the GPU
    the cu_seqlens are the caller's contract (start at 0, non-decreasing, end at the totals,
    within the max lengths); the CPU backend checks them. lse is ``[heads_q, total_q]``."""
    out, lse = torch.ops.llmk.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                               int(max_seqlen_k), causal, _scale_or_default(scale, q.shape[-1]),
                                               return_lse)
    return (out, lse) if return_lse else out


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` on ``[batch, heads, seq, head_dim]``
    tensors, through :func:`attention` (no copies: the layouts are transposed views). Supports
    what the llmk kernel computes: no attn_mask, no dropout, is_causal with seq_q == seq_k
    (PyTorch aligns a causal mask top-left, llmk bottom-right; they agree only then)."""
    if attn_mask is not None:
        raise ValueError("llmk.scaled_dot_product_attention: attn_mask is not supported (use is_causal)")
    if dropout_p != 0.0:
        raise ValueError("llmk.scaled_dot_product_attention: dropout_p must be 0 (forward inference kernel)")
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError("llmk.scaled_dot_product_attention: query, key and value must be [batch, heads, seq, head_dim]")
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError(f"llmk.scaled_dot_product_attention: {query.shape[1]} query heads and {key.shape[1]} key "
                         "heads need enable_gqa=True")
    if is_causal and query.shape[2] != key.shape[2]:
        raise ValueError("llmk.scaled_dot_product_attention: is_causal with seq_q != seq_k is aligned top-left by "
                         "PyTorch and bottom-right by llmk; call llmk.attention(causal=True) for the latter")
    out = attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=is_causal, scale=scale)
    return out.transpose(1, 2)
