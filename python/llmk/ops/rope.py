"""Rotary position embedding: rope_ / rope_backward_ in place on q and k (one launch), the
functional, differentiable rope / rope_backward, and rope_cos_sin_cache.
C++ kernels: python/src/ops_rope.cc over include/llmk/rope.h (its header comment documents
the layouts, styles and angle sources)."""

import math
from typing import List, Optional

import torch
from torch import Tensor

from ._table import define, like, public

_ANGLES = ("Tensor positions, Tensor? cos_sin_cache=None, float? theta=None, int rot_dim=0, str style='neox', "
           "float[]? llama3_scaling=None")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _llama3_list(op: str, llama3_scaling: Optional[dict]) -> Optional[List[float]]:
    if llama3_scaling is None:
        return None
    missing = [key for key in _LLAMA3_KEYS if key not in llama3_scaling]
    if missing:
        raise ValueError(f"{op}: llama3_scaling lacks {missing} (Hugging Face's rope_scaling keys)")
    return [float(llama3_scaling[key]) for key in _LLAMA3_KEYS]


def _angles(op, cos_sin_cache, theta, rot_dim, style, llama3_scaling) -> tuple:
    """The public keywords as the ops' trailing arguments (rot_dim None -> 0: the whole head)."""
    return cos_sin_cache, theta, rot_dim or 0, style, _llama3_list(op, llama3_scaling)


def _functional_fake(q, k, *angles):
    return like(q), like(k) if k is not None else q.new_empty(0)


def _rope_setup(ctx, inputs, output):
    ctx.angles = inputs[2:]
    ctx.has_k = inputs[1] is not None
    if not ctx.has_k:
        ctx.mark_non_differentiable(output[1])


def _rope_grad(ctx, dq, dk):
    dq, dk = _rope_backward(dq, dk if ctx.has_k else None, *ctx.angles)
    return (dq, dk if ctx.has_k else None) + (None,) * len(ctx.angles)


_rope_inplace = define(f"rope_(Tensor(a!) q, Tensor(b!)? k, {_ANGLES}) -> ()", lambda *args: None, public=False)
_rope_backward_inplace = define(f"rope_backward_(Tensor(a!) dq, Tensor(b!)? dk, {_ANGLES}) -> ()",
                                lambda *args: None, public=False)
_rope = define(f"rope(Tensor q, Tensor? k, {_ANGLES}) -> (Tensor, Tensor)", _functional_fake,
               setup=_rope_setup, backward=_rope_grad, public=False)
_rope_backward = define(f"rope_backward(Tensor dq, Tensor? dk, {_ANGLES}) -> (Tensor, Tensor)", _functional_fake,
                        public=False)


@public
def rope_(q: Tensor, k: Optional[Tensor], positions: Tensor, cos_sin_cache: Optional[Tensor] = None, *,
          theta: Optional[float] = None, rot_dim: Optional[int] = None, style: str = "neox",
          llama3_scaling: Optional[dict] = None) -> None:
    """Rotary position embedding in place on ``q`` and ``k`` (one launch).

    q: ``[tokens, heads_q, head_dim]`` or ``[batch, seq, heads_q, head_dim]`` (any strides with a
    contiguous last dim, e.g. head slices of a fused qkv tensor); k: the same leading dims and
    head_dim with its own head count, or None. positions: int32/int64 with q's leading dims
    (``[seq]`` broadcasts over the batch). The angles come from ``cos_sin_cache`` (float32
    ``[max_pos, rot_dim]``, cos then sin: vLLM's layout; its width is the rotary dim) or from
    ``theta`` (default 10000) over ``rot_dim`` (default head_dim) with optional Llama 3.1
    ``llama3_scaling`` (Hugging Face's rope_scaling dict); theta, rot_dim and llama3_scaling
    given with a cache are rejected unless rot_dim equals the cache's width. style: ``"neox"``
    (rotate halves) or ``"gptj"`` (interleaved pairs). On the GPU a position outside the
    cache gives NaN for that token; on the CPU it raises."""
    _rope_inplace(q, k, positions, *_angles("rope_", cos_sin_cache, theta, rot_dim, style, llama3_scaling))


@public
def rope_backward_(dq: Tensor, dk: Optional[Tensor], positions: Tensor, cos_sin_cache: Optional[Tensor] = None, *,
                   theta: Optional[float] = None, rot_dim: Optional[int] = None, style: str = "neox",
                   llama3_scaling: Optional[dict] = None) -> None:
    """The backward of :func:`rope_`, in place: the inverse rotation of the gradients ``dq``
    and ``dk`` (the same arguments as rope_)."""
    _rope_backward_inplace(dq, dk, positions, *_angles("rope_backward_", cos_sin_cache, theta, rot_dim, style, llama3_scaling))


@public
def rope(q: Tensor, k: Optional[Tensor], positions: Tensor, cos_sin_cache: Optional[Tensor] = None, *,
         theta: Optional[float] = None, rot_dim: Optional[int] = None, style: str = "neox",
         llama3_scaling: Optional[dict] = None):
    """Out-of-place, differentiable :func:`rope_`: returns the rotated ``(q, k)`` (k None when
    not given) as new contiguous tensors, in one launch; their gradient is the inverse rotation."""
    q_out, k_out = _rope(q, k, positions, *_angles("rope", cos_sin_cache, theta, rot_dim, style, llama3_scaling))
    return q_out, (k_out if k is not None else None)


@public
def rope_backward(dq: Tensor, dk: Optional[Tensor], positions: Tensor, cos_sin_cache: Optional[Tensor] = None, *,
                  theta: Optional[float] = None, rot_dim: Optional[int] = None, style: str = "neox",
                  llama3_scaling: Optional[dict] = None):
    """Out-of-place backward of :func:`rope`: the gradients of its inputs ``(dq, dk)`` as new
    contiguous tensors (dk None when not given)."""
    dq_out, dk_out = _rope_backward(dq, dk, positions, *_angles("rope_backward", cos_sin_cache, theta, rot_dim, style, llama3_scaling))
    return dq_out, (dk_out if dk is not None else None)


@public
def rope_cos_sin_cache(max_position: int, rot_dim: int, theta: float = 10000.0,
                       llama3_scaling: Optional[dict] = None, device=None) -> Tensor:
    """The float32 ``[max_position, rot_dim]`` cos/sin cache of :func:`rope_`, computed in float64."""
    i = torch.arange(0, rot_dim // 2, dtype=torch.float64)
    inv_freq = theta ** (-2.0 * i / rot_dim)
    if llama3_scaling is not None:
        factor, low, high, original = _llama3_list("rope_cos_sin_cache", llama3_scaling)
        wavelen = 2 * math.pi / inv_freq
        smooth = (original / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
        medium = (wavelen >= original / high) & (wavelen <= original / low)
        inv_freq = torch.where(medium, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    angles = torch.arange(max_position, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(torch.float32).to(device)
