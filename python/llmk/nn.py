"""Drop-in modules built on llmk ops."""

import torch
from torch import Tensor

from .ops import add_rmsnorm, layernorm, linear, rmsnorm
from .quantization import QuantizedLinear  # noqa: F401 (llmk.nn.QuantizedLinear: int4 / int8 weights)


class RMSNorm(torch.nn.Module):
    """RMSNorm over the last dim, a drop-in for Llama/Qwen/Mistral's ``*RMSNorm`` modules.

    ``forward(x)`` returns ``rmsnorm(x)``; ``forward(x, residual)`` returns
    ``(rmsnorm(x + residual), x + residual)`` from one fused kernel. ``offset=1.0`` gives
    Gemma's ``(1 + weight)`` (its weight then starts at zeros, as Gemma's does).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, offset: float = 0.0, device=None, dtype=None):
        super().__init__()
        init = torch.zeros if offset else torch.ones
        self.weight = torch.nn.Parameter(init(hidden_size, device=device, dtype=dtype))
        self.variance_epsilon = eps
        self.offset = offset

    def forward(self, x: Tensor, residual: Tensor = None):
        if residual is None:
            return rmsnorm(x, self.weight, self.variance_epsilon, self.offset)
        return add_rmsnorm(x, residual, self.weight, self.variance_epsilon, self.offset)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.variance_epsilon}, offset={self.offset}"

    @classmethod
    def from_module(cls, module: torch.nn.Module, offset: float = 0.0) -> "RMSNorm":
        """Builds an llmk RMSNorm sharing the weight of a Hugging Face style RMSNorm module."""
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6))
        new = cls(module.weight.shape[0], eps=eps, offset=offset, device="meta")
        new.weight = module.weight
        return new


def patch_rmsnorm(model: torch.nn.Module, offset: float = 0.0) -> int:
    """Replaces every submodule whose class name ends in ``RMSNorm`` with :class:`RMSNorm`
    (sharing its weight). Returns how many were replaced."""
    replaced = 0
    for name, child in list(model.named_children()):
        if type(child).__name__.endswith("RMSNorm") and not isinstance(child, RMSNorm):
            setattr(model, name, RMSNorm.from_module(child, offset=offset))
            replaced += 1
        else:
            replaced += patch_rmsnorm(child, offset)
    return replaced


class LayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` over the last dim, computed by llmk (same parameters and state
    dict, so it loads any LayerNorm checkpoint)."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine, bias=bias,
                         device=device, dtype=dtype)
        if len(self.normalized_shape) != 1:
            raise ValueError(f"llmk.nn.LayerNorm normalizes the last dim only, got {self.normalized_shape}")

    def forward(self, x: Tensor) -> Tensor:
        return layernorm(x, self.weight, self.bias, self.eps)


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` computed by llmk's GEMM (``llmk.linear``): the same parameters, init and
    state dict, so it loads any Linear checkpoint. float16/bfloat16 weights and inputs (the
    GEMM kernels' dtypes; float32 raises), with autograd."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)

    @classmethod
    def from_linear(cls, module: torch.nn.Linear) -> "Linear":
        """An llmk Linear sharing the weight and bias (the same Parameters) of ``module``."""
        new = cls(module.in_features, module.out_features, bias=module.bias is not None, device="meta")
        new.weight = module.weight
        new.bias = module.bias
        return new
