"""llmk: fused GPU kernels for transformer language models, as PyTorch ops.

Every op is registered as ``torch.ops.llmk.<name>`` with CPU and CUDA kernels in C++ (through
PyTorch's stable ABI), a fake (meta) implementation for ``torch.compile`` and, where it
trains, autograd; the table of ops is python/llmk/ops.
"""

from typing import Tuple

from . import ops  # defines the ops: schemas, fakes, autograd
from . import _C  # registers their C++ kernels
from . import distributed, nn, optim, quantization
from .patching import PatchReport, patch, unpatch

globals().update(ops.PUBLIC)
__all__ = [*ops.PUBLIC, "distributed", "nn", "optim", "quantization", "patch", "unpatch", "PatchReport", "device_info",
           "attention_head_dims"]


def __getattr__(name: str):
    """``llmk.generation`` (KVCache and ``decode=True``'s model changes) imports on first use:
    it needs transformers, which llmk itself does not."""
    if name == "generation":
        import importlib

        return importlib.import_module(".generation", __name__)
    raise AttributeError(f"module 'llmk' has no attribute {name!r}")


def device_info(index: int = 0) -> dict:
    """Facts of CUDA device `index` as llmk sees them (``available`` is False without one)."""
    return _C.device_info(index)


def attention_head_dims(compiled: bool = True, decode: bool = False) -> Tuple[int, ...]:
    """The head dims of :func:`attention` (and its backward, varlen and SDPA forms), or with
    ``decode`` those of :func:`attention_decode`, from the C++ library's one list.

    ``compiled`` (the default): the head dims this build has CUDA kernels for (CMake's
    ``LLMK_HEAD_DIMS`` trims them); ``compiled=False``: every head dim the op accepts, which the
    CPU backend computes whatever the build. ``llmk info`` prints both."""
    dims = _C.attention_decode_head_dims() if decode else _C.attention_head_dims()
    return tuple(d for d in dims if not compiled or _C.attention_head_dim_compiled(d))
