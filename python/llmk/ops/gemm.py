"""GEMM ops: linear (``act(x · weightᵀ + bias) + residual`` with the epilogue fused into the
matrix multiply, nn.Linear's weight layout) and rmsnorm_linear (RMSNorm then a projection
in one launch, for decode). C++ kernels: python/src/ops_gemm.cc over include/llmk/gemm.h
(its header comment has the layouts the kernels take and the alignment they need).

Autograd. The backward's GEMMs are llmk.linear calls on transposed views (no copies):
``dX = linear(dZ, W.t())`` and ``dW = linear(dZ2d.t(), X2d.t())``, where
dZ is the gradient of the pre-activation ``z = x · Wᵀ + bias``; ``dbias`` is dZ summed over
the rows (fp32 sums), ``dresidual`` is dY itself. The forward saves its inputs only: with an
activation the backward recomputes z (one more GEMM) and goes through llmk's activation
backwards, ``silu_and_mul_backward(dY, z)`` for silu_mul (z = [gate | up]) and
``bias_gelu_backward(dY, z, 0, approximate)`` for gelu / gelu_tanh (which gives dbias
too). rmsnorm_linear's backward recomputes ``y = rmsnorm(x)``, then ``dW`` and
``dy`` as linear's, and ``rmsnorm_backward`` for dx and the norm weight's gradient.
Shapes the GEMM kernels cannot take in the backward (a feature count that is not a multiple
of 16 bytes, which makes the transposed views' rows misaligned) go to torch.matmul there.
"""

import torch

from ._table import define
from .activation import ACTIVATIONS, LINEAR_ACTIVATIONS, bias_gelu_backward, gated_width, one_of, silu_and_mul_backward
from .norm import _rmsnorm, rmsnorm_backward


def linear_out_features(n, activation: str):
    """linear's output width over a weight of n rows: n, or for 'silu_mul' (gate rows, then as
    many up rows) the gated width n / 2. Raises linear's errors for an unknown activation or an
    odd n with 'silu_mul', as the C++ op does (shapes only: it runs on fake and meta tensors)."""
    if activation not in LINEAR_ACTIVATIONS:
        raise RuntimeError(f"linear: activation must be {one_of(LINEAR_ACTIVATIONS)}, got '{activation}'")
    if activation != "silu_mul":
        return n
    torch._check(n % 2 == 0, lambda: "linear: activation 'silu_mul' needs an even number of weight rows (gate then "
                                     f"up), got {n}")
    return gated_width(n)


def _linear_fake(x, weight, bias, residual, activation):
    if weight.dim() != 2:  # the C++ op's checks, in its order, so that a meta tensor gets its errors
        raise RuntimeError(f"linear: weight has {weight.dim()} dims; expected [N, K]")
    n = linear_out_features(weight.shape[0], activation)
    if x.dim() < 1:
        raise RuntimeError("linear: x is a 0-d tensor; expected [..., K]")
    return x.new_empty((*x.shape[:-1], n))


def _aligned(t: torch.Tensor) -> bool:
    """t's rows are 16-byte aligned: every stride but the unit one (a contiguous last dim, or
    a transposed view's first) is a multiple of 16 bytes or steps over a dim of size 1; and t
    has elements. Shapes only, so that it also runs on fake tensors (torch.compile)."""
    elt = t.element_size()
    return t.numel() > 0 and all(s == 1 or n == 1 or (s * elt) % 16 == 0 for n, s in zip(t.shape, t.stride()))


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a · bᵀ`` for the backward: llmk's GEMM on views the kernels take, else torch.matmul."""
    if _aligned(a) and _aligned(b):
        return linear(a, b, None, None, "none")
    return torch.matmul(a, b.t())


def _row_sum(dz: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return dz.reshape(-1, dz.shape[-1]).sum(0, dtype=torch.float32).to(dtype)


def _linear_setup(ctx, inputs, output):
    x, weight, bias, residual, ctx.activation = inputs
    ctx.has_residual = residual is not None
    ctx.save_for_backward(x, weight, bias)


def _linear_dz(ctx, dy, x, weight, bias):
    """(dZ, dbias or None): the gradient of the pre-activation z = x · Wᵀ + bias."""
    need_dbias = bias is not None and ctx.needs_input_grad[2]
    if ctx.activation == "none":
        return dy, _row_sum(dy, bias.dtype) if need_dbias else None
    if ctx.activation == "silu_mul":
        dz = silu_and_mul_backward(dy, linear(x, weight, bias, None, "none"))
        return dz, _row_sum(dz, bias.dtype) if need_dbias else None
    # gelu: bias_gelu_backward over z (biased, rounded once as PyTorch's F.linear rounds it) and a
    # zero bias gives dZ and its row sum, the bias's gradient, in one pass.
    z = linear(x, weight, bias, None, "none")
    dz, dbias = bias_gelu_backward(dy, z, z.new_zeros(z.shape[-1]), ACTIVATIONS[ctx.activation].approximate)
    return dz, dbias if need_dbias else None


def _linear_grad(ctx, dy):
    x, weight, bias = ctx.saved_tensors
    dy = dy.contiguous()
    need_dx, need_dw = ctx.needs_input_grad[:2]
    dx = dw = None
    dz, dbias = _linear_dz(ctx, dy, x, weight, bias)
    if need_dx:
        dx = _mm(dz, weight.t())
    if need_dw:
        dw = _mm(dz.reshape(-1, dz.shape[-1]).t(), x.reshape(-1, x.shape[-1]).t()).to(weight.dtype)
    dresidual = dy if ctx.has_residual and ctx.needs_input_grad[3] else None
    return dx, dw, dbias, dresidual, None


linear = define(
    "linear(Tensor x, Tensor weight, Tensor? bias=None, Tensor? residual=None, str activation='none') -> Tensor",
    _linear_fake, setup=_linear_setup, backward=_linear_grad,
    doc="``act(x · weightᵀ + bias) + residual`` in one GEMM with its epilogue fused (fp32 accumulation, "
        "one rounding): ``torch.nn.functional.linear`` plus what follows it in a transformer block.\n\n"
        "x ``[..., K]`` (K-contiguous rows; or a 2-d transposed view, stride(0) == 1) and weight ``[N, K]`` "
        "(nn.Linear's layout, or a transposed ``[K, N]`` tensor's view) are float16 or bfloat16, the same "
        "dtype; the output has x's dtype and shape ``[..., N_out]``. bias ``[N]`` (before the activation) "
        "and residual (the output's shape, added after it) have x's dtype. ``activation``:\n\n"
        "- ``'none'``: ``x · weightᵀ + bias + residual``;\n"
        "- ``'silu_mul'``: weight holds a gate projection over its first N/2 rows and an up projection "
        "over the rest (``torch.cat([gate_w, up_w])``), z = x · weightᵀ + bias, the output is "
        "``silu(z[..., :N/2]) * z[..., N/2:] + residual`` of N_out = N/2 columns (the SwiGLU MLP's first "
        "GEMM, without the [..., N] intermediate in memory);\n"
        "- ``'gelu'`` / ``'gelu_tanh'``: ``F.gelu(z)`` with approximate ``'none'`` / ``'tanh'``.\n\n"
        "Rows of x and weight must be 16-byte aligned (K a multiple of 8) unless there is one of them. "
        "With autograd (dx, dweight, dbias, dresidual; the backward recomputes z when there is an "
        "activation). CPU tensors run the double-accumulation reference; float32 is rejected (the GEMM "
        "kernels take float16/bfloat16 operands).")


def _rmsnorm_linear_setup(ctx, inputs, output):
    x, norm_weight, weight, ctx.eps = inputs
    ctx.save_for_backward(x, norm_weight, weight)


def _rmsnorm_linear_grad(ctx, dout):
    x, norm_weight, weight = ctx.saved_tensors
    dout = dout.contiguous()
    need_dx, need_dg, need_dw = ctx.needs_input_grad[:3]
    dx = dg = dw = None
    if need_dw:
        y = _rmsnorm(x, norm_weight, ctx.eps, 0.0)
        dw = _mm(dout.reshape(-1, dout.shape[-1]).t(), y.reshape(-1, y.shape[-1]).t()).to(weight.dtype)
    if need_dx or need_dg:
        dx, dg = rmsnorm_backward(_mm(dout, weight.t()), x, norm_weight, ctx.eps, 0.0, None)
    return dx, dg, dw, None


define(
    "rmsnorm_linear(Tensor x, Tensor norm_weight, Tensor weight, float eps=1e-06) -> Tensor",
    lambda x, norm_weight, weight, eps: x.new_empty((*x.shape[:-1], weight.shape[0])),
    setup=_rmsnorm_linear_setup, backward=_rmsnorm_linear_grad,
    doc="``rmsnorm(x, norm_weight, eps) · weightᵀ``, the decode step's norm before the qkv or gate/up "
        "projection: up to 32 rows in one launch, the normalized rows never in memory; from 33 rows on a "
        "Hopper GPU ``rmsnorm`` into scratch memory, then the Hopper GEMM (elsewhere the one-launch kernel, "
        "which reads the weight once per 64 rows). x ``[..., K]`` (K-contiguous rows) and weight ``[N, K]`` "
        "(K-contiguous) are float16 or bfloat16, the same; norm_weight ``[K]`` has x's dtype or float32; "
        "the output is ``[..., N]`` of x's dtype. With autograd (recomputes the normalized rows: dx, "
        "dnorm_weight, dweight).")
