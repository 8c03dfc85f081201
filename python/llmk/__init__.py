"""llmk: fused GPU kernels for transformer language models, as PyTorch ops.

Every op is registered as ``torch.ops.llmk.<name>`` with CPU and CUDA kernels in C++ (through
PyTorch's stable ABI), a fake (meta) implementation for ``torch.compile`` and, where it
trains, autograd; the table of ops is python/llmk/ops.
"""

from . import ops  # defines the ops: schemas, fakes, autograd
from . import _C  # registers their C++ kernels
from . import nn, optim
from .patching import PatchReport, patch, unpatch

globals().update(ops.PUBLIC)
__all__ = [*ops.PUBLIC, "nn", "optim", "patch", "unpatch", "PatchReport", "device_info"]


def device_info(index: int = 0) -> dict:
    """Facts of CUDA device `index` as llmk sees them (``available`` is False without one)."""
    return _C.device_info(index)
