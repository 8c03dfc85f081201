"""llmk on torch.distributed: the collectives of a tensor-parallel transformer layer together
with the ops that follow them.

A row-parallel projection (attention's o_proj, the MLP's down_proj) leaves each rank a partial
sum of the layer's output; the layer then all-reduces it, adds it to the residual stream and
normalizes the sum for the next block. :func:`all_reduce_add_rmsnorm` is that sequence as one
call, in place, on the caller's stream, in one of two ways:

- ``fused``: one llmk kernel per rank (``torch.ops.llmk.all_reduce_add_rmsnorm_``) over peer
  buffers: every rank pushes its x into the others' buffers over NVLink with plain stores, then
  sums, adds and normalizes its rows (include/llmk/all_reduce.h). For CUDA tensors on an NCCL
  group whose ranks share a host (CUDA IPC), messages up to the buffers' capacity.
- ``nccl``: the group's all-reduce (NCCL on GPUs, gloo on CPUs), then llmk's ``add_rmsnorm_``.

``LLMK_ALL_REDUCE_PATH`` = ``auto`` (default: fused where it fits and is measured faster,
:func:`all_reduce_path` says which), ``fused`` (an error where it cannot run) or ``nccl``, read
at each call. Both are captured by CUDA graphs. The peer group is set up at a group's first
fused call, a collective step that every rank reaches in the same call (or beforehand by
:func:`setup_peer_group`; a call being captured into a CUDA graph cannot set one up and takes
the nccl path).
"""

import math
import os
from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist

from . import _C

__all__ = ["all_reduce_add_rmsnorm", "all_reduce_path", "setup_peer_group", "release_peer_groups"]

_OP = "all_reduce_add_rmsnorm"
PATH_VAR = "LLMK_ALL_REDUCE_PATH"
PATHS = ("auto", "fused", "nccl")
# Bytes of the largest message a peer group takes (x's bytes: 128 tokens x 8192 in float32).
DEFAULT_CAPACITY = 4 << 20
# The largest message auto sends through the fused kernels, by the most ranks it was measured
# for: up to the peer buffers' 4 MiB the fused path was faster than NCCL's all-reduce +
# add_rmsnorm_ on 2 and 4 H200s (docs/kernels/distributed.md); 5-8 ranks are unmeasured and
# kept to 1 MiB.
AUTO_MAX_BYTES = ((4, 4 << 20), (8, 1 << 20))


def _auto_max_bytes(world: int) -> int:
    return next(limit for ranks, limit in AUTO_MAX_BYTES if world <= ranks)


class PeerGroup:
    """This rank's side of a group's peer buffers: its own buffer, the peers' mapped here, and
    the id under which the op finds them. Built collectively (every rank of the group): a rank
    that cannot allocate or map the buffers tells the others, and the group's fused path is off
    on every rank (``error`` says why)."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device, capacity: int):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.capacity = capacity
        self.device = device
        self.own = self.id = None
        self.mapped = []
        self.error = ""
        with torch.cuda.device(device):
            handle = self._attempt(self._allocate)
            handles = [None] * self.world
            dist.all_gather_object(handles, handle, group=group)
            failed = [r for r, h in enumerate(handles) if h is None]
            buffers = []
            if not failed:
                self._attempt(lambda: buffers.extend(self._map(handles)))
            if self._agree(not failed and not self.error):
                self.id = _C.register_peer_group(self.rank, self.world, capacity, buffers)
            else:
                self.error = self.error or f"rank(s) {failed or '?'} could not allocate or map the peer buffers"
                self.release()

    def _attempt(self, step):
        try:
            return step()
        except RuntimeError as e:  # out of memory, not on one host, no peer access
            self.error = self.error or str(e)
            return None

    def _allocate(self) -> bytes:
        self.own = _C.allocate_peer_buffer(_C.peer_buffer_bytes(self.world, self.capacity))
        return _C.peer_buffer_handle(self.own)

    def _map(self, handles) -> list:
        buffers = []
        for r, handle in enumerate(handles):
            if r != self.rank:
                self.mapped.append(_C.open_peer_buffer(handle))
            buffers.append(self.own if r == self.rank else self.mapped[-1])
        return buffers

    def _agree(self, ok: bool) -> bool:
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return int(flag.item()) == 1

    def release(self) -> None:
        """Unmaps the peers' buffers and frees this rank's, collectively: every rank closes its
        mappings before any rank frees (barriers between). A CUDA graph that captured a fused
        call on the group holds the buffers' addresses: drop it first."""
        torch.cuda.synchronize(self.device)
        dist.barrier(group=self.group)
        if self.id is not None:
            _C.unregister_peer_group(self.id)
            self.id = None
        for m in self.mapped:
            _C.close_peer_buffer(m)
        self.mapped = []
        dist.barrier(group=self.group)
        if self.own is not None:
            _C.free_peer_buffer(self.own)
            self.own = None


_GROUPS: Dict[tuple, PeerGroup] = {}


def _key(group: Optional[dist.ProcessGroup], device: torch.device) -> tuple:
    """A group's entry: the process group object itself (the default group resolved, so a new
    one after destroy_process_group / init_process_group is a new entry), and the device."""
    return (dist.group.WORLD if group is None else group, device.index)


def setup_peer_group(group: Optional[dist.ProcessGroup] = None, device: Optional[torch.device] = None,
                     capacity: int = DEFAULT_CAPACITY) -> PeerGroup:
    """Sets up (once; a collective call on every rank of ``group``) and returns the peer group
    that the fused path of ``group`` uses on ``device`` (default: the current CUDA device).
    Its ``error`` says why the ranks could not allocate or map each other's buffers (the fused
    path is then off for the group)."""
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    key = _key(group, device)
    if key not in _GROUPS:
        _GROUPS[key] = PeerGroup(key[0], device, capacity)
    return _GROUPS[key]


def release_peer_groups() -> None:
    """Frees every peer group's buffers, collectively (every rank calls it): before
    ``destroy_process_group``, or to set groups up again with another capacity. CUDA graphs that
    captured fused calls must be dropped first."""
    for g in _GROUPS.values():
        g.release()
    _GROUPS.clear()


def _check(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> None:
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
    if residual.stride(-1) != 1 or weight.stride(0) != 1:
        raise ValueError(f"{_OP}: residual's last dim and weight must be contiguous, got strides "
                         f"{residual.stride()} and {weight.stride()}")
    if not (math.isfinite(eps) and eps > 0) or not math.isfinite(offset):
        raise ValueError(f"{_OP}: eps must be a finite number > 0 and offset finite, got {eps} and {offset}")
    for (a, ta), (b, tb) in (((("x", x), ("residual", residual))), (("x", x), ("weight", weight)),
                             (("residual", residual), ("weight", weight))):
        if _overlap(ta, tb):
            raise ValueError(f"{_OP}: {a} and {b} overlap in memory; they must be disjoint")


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory spans of a and b (non-negative strides) intersect."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False

    def span(t):
        start = t.data_ptr()
        return start, start + (sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def _path_setting() -> str:
    path = os.environ.get(PATH_VAR, "") or "auto"
    if path not in PATHS:
        raise ValueError(f"{_OP}: {PATH_VAR}={path!r}; expected one of {', '.join(PATHS)}")
    return path


def _fused_unfit(x: torch.Tensor, group: Optional[dist.ProcessGroup]) -> str:
    """Why x cannot take the fused path on ``group`` ('' when it can): properties that every
    rank's x shares (shape, dtype, the group), so that every rank picks the same path."""
    if not x.is_cuda:
        return "x is not a CUDA tensor"
    backend = dist.get_backend(group)
    if backend != "nccl":
        return f"the group's backend is {backend}, not nccl"
    world = dist.get_world_size(group)
    if not 2 <= world <= 8:
        return f"the group has {world} ranks (the fused kernel takes 2 to 8)"
    if (x.shape[-1] * x.element_size()) % 16:
        return f"x's rows ({x.shape[-1]} x {x.element_size()} bytes) are not whole 16-byte vectors"
    known = _GROUPS.get(_key(group, x.device))
    capacity = known.capacity if known is not None else DEFAULT_CAPACITY
    if x.numel() * x.element_size() > capacity:
        return f"x holds {x.numel() * x.element_size()} bytes, more than the peer buffers' {capacity}"
    if known is None and torch.cuda.is_current_stream_capturing():
        return "the group's peer buffers are not set up and a CUDA graph is being captured (setup_peer_group first)"
    return ""


def all_reduce_path(x: torch.Tensor, group: Optional[dist.ProcessGroup] = None) -> str:
    """The path :func:`all_reduce_add_rmsnorm` takes for ``x`` on ``group``: ``"fused"`` or
    ``"nccl"`` (``LLMK_ALL_REDUCE_PATH`` and the message's size decide; see the module's
    docstring). May set the group's peer buffers up (a collective call)."""
    setting = _path_setting()
    if setting == "nccl":
        return "nccl"
    unfit = _fused_unfit(x, group)
    if setting == "fused" and unfit:
        raise ValueError(f"{_OP}: {PATH_VAR}=fused, but {unfit}")
    if unfit or (setting == "auto" and x.numel() * x.element_size() > _auto_max_bytes(dist.get_world_size(group))):
        return "nccl"
    peers = setup_peer_group(group, x.device)
    if peers.id is None:
        if setting == "fused":
            raise RuntimeError(f"{_OP}: {PATH_VAR}=fused, but the ranks could not map each other's buffers: "
                               f"{peers.error}")
        return "nccl"
    return "fused"


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """t, or a contiguous copy of it that starts 16-byte aligned (the fused kernel's 16-byte
    vectors; a strided residual is copied too, whatever its rows' spacing)."""
    return t if t.data_ptr() % 16 == 0 and t.is_contiguous() else t.clone(memory_format=torch.contiguous_format)


def _fused(x, residual, weight, eps, offset, group) -> None:
    peers = _GROUPS[_key(group, x.device)]
    xa, ra = _aligned(x), _aligned(residual)
    torch.ops.llmk.all_reduce_add_rmsnorm_(xa, ra, _aligned(weight), float(eps), float(offset), peers.id)
    for t, a in ((x, xa), (residual, ra)):
        if a is not t:
            t.copy_(a)


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
    (NCCL's all-reduce; the fused path sums in fp32 in rank order, so every rank gets the same
    bits), the add before it is normalized (as ``add_rmsnorm_``). Returns ``(x, residual)``.
    Arguments are checked before anything is written."""
    _check(x, residual, weight, eps, offset)
    if all_reduce_path(x, group) == "fused":
        _fused(x, residual, weight, eps, offset, group)
    else:
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)
        torch.ops.llmk.add_rmsnorm_(x, residual, weight, float(eps), float(offset))
    return x, residual
