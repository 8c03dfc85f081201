"""The tensor-parallel op: ``torch.ops.llmk.all_reduce_add_rmsnorm_`` runs a group's
all-reduce, the residual add and the RMSNorm in one kernel over peer buffers (C++:
include/llmk/all_reduce.h, python/src/ops_distributed.cc). Its ``group`` is the id of a peer
group that :mod:`llmk.distributed` set up (buffers allocated, CUDA IPC handles exchanged);
the public function is ``llmk.distributed.all_reduce_add_rmsnorm``, which sets the group up and
picks between this op and the collective library's all-reduce + ``add_rmsnorm_``."""

from ._table import define

define(
    "all_reduce_add_rmsnorm_(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps, float offset, "
    "int group) -> ()",
    lambda x, residual, weight, eps, offset, group: None, public=False,
    doc="In place over the ranks of peer group ``group``: ``residual += sum of the ranks' x; x = "
        "rmsnorm(residual)``. A group of one rank is ``add_rmsnorm_``.")
