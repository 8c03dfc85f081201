"""The llmk ops, by family; importing this package defines every ``torch.ops.llmk`` op (see
_table.py) and exports the public functions, which ``llmk`` re-exports as its API."""

from . import activation, attention, decode, distributed, gemm, loss, norm, optim, quantized, rope, softmax  # noqa: F401,E501 (each defines ops)
from ._table import OPS, PUBLIC

globals().update(PUBLIC)
__all__ = list(PUBLIC)
