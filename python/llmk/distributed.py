"""llmk on torch.distributed: the collectives of a tensor-parallel transformer layer together
with the ops that follow them.

A row-parallel projection (attention's o_proj, the MLP's down_proj) leaves each rank a partial
sum of the layer's output; the layer then all-reduces it, adds it to the residual stream and
normalizes the sum for the next block. :func:`all_reduce_add_rmsnorm` is that sequence as one
call. It runs the group's all-reduce (NCCL on GPUs, gloo on CPUs) on ``x`` and then llmk's
``add_rmsnorm_`` (the add and the norm in one pass), in place, on the caller's stream, so a
CUDA graph captures it as it captures NCCL.
"""

from typing import Optional, Tuple

import torch
import torch.distributed as dist

__all__ = ["all_reduce_add_rmsnorm"]

_OP = "all_reduce_add_rmsnorm"


def _check(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> None:
    """Every argument, before anything is written (the all-reduce modifies x in place)."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{_OP}: torch.distributed is not initialized (call init_process_group first)")
    for name, t in (("x", x), ("residual", residual), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{_OP}: {name} must be a tensor, got {type(t).__name__}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"{_OP}: x has dtype {x.dtype}; expected float32, float16 or bfloat16")
    if x.dim() == 0 or not x.is_contiguous():
        raise ValueError(f"{_OP}: x must be a contiguous tensor of rows [..., hidden] (the all-reduce runs on "
                         f"its storage), got shape {tuple(x.shape)} and strides {x.stride()}")
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(f"{_OP}: residual must match x ({tuple(x.shape)}, {x.dtype}, {x.device}), got "
                         f"{tuple(residual.shape)}, {residual.dtype}, {residual.device}")
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"{_OP}: weight must be [hidden] = [{x.shape[-1]}], got {tuple(weight.shape)}")
    if weight.dtype not in (x.dtype, torch.float32) or weight.device != x.device:
        raise ValueError(f"{_OP}: weight must be on x's device ({x.device}) in x's dtype or float32, got "
                         f"{weight.dtype} on {weight.device}")


def all_reduce_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                           group: Optional[dist.ProcessGroup] = None,
                           offset: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """The sum of ``x`` over the ranks of ``group`` (default: the world), added to ``residual``
    and normalized, in place:

        residual += all_reduce(x);  x = rmsnorm(residual, weight, eps, offset)

    ``x`` and ``residual``: the same shape ``[..., hidden]`` and dtype (float32, float16 or
    bfloat16), ``x`` contiguous; ``weight``: ``[hidden]`` in x's dtype or float32 (``offset=1``
    gives Gemma's ``1 + weight``). Every rank passes its own ``x`` and the same ``residual`` and
    ``weight``, and gets the same results. The sum is rounded to the dtype before it is added
    (as NCCL's all-reduce followed by an add), the add before it is normalized (as
    ``add_rmsnorm_``). Returns ``(x, residual)``. Arguments are checked before anything is
    written."""
    _check(x, residual, weight)
    dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)
    torch.ops.llmk.add_rmsnorm_(x, residual, weight, float(eps), float(offset))
    return x, residual
