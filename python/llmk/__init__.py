"""llmk: fused GPU kernels for transformer language models, as PyTorch ops.

Every op is registered as ``torch.ops.llmk.<name>`` with CPU and CUDA implementations,
a fake (meta) implementation for ``torch.compile`` and, where it trains, autograd.
"""

from . import _C
from .ops import (add_rmsnorm, attention, attention_varlen, scaled_dot_product_attention, add_rmsnorm_, bias_gelu, bias_gelu_backward, gelu_and_mul, gelu_and_mul_backward,
                  layernorm, layernorm_backward, log_softmax, log_softmax_backward, rmsnorm, rmsnorm_backward,
                  rmsnorm_swiglu, rmsnorm_swiglu_backward, rope, rope_, rope_cos_sin_cache, silu_and_mul,
                  silu_and_mul_backward, softmax, softmax_backward, swiglu, swiglu_backward)
from . import nn, optim

__all__ = ["rmsnorm", "add_rmsnorm", "add_rmsnorm_", "rmsnorm_backward", "layernorm", "layernorm_backward",
           "silu_and_mul", "gelu_and_mul", "swiglu", "silu_and_mul_backward", "gelu_and_mul_backward",
           "swiglu_backward", "softmax", "log_softmax", "softmax_backward", "log_softmax_backward",
           "rope", "rope_", "rope_cos_sin_cache", "bias_gelu", "bias_gelu_backward", "rmsnorm_swiglu", "rmsnorm_swiglu_backward",
           "attention", "attention_varlen", "scaled_dot_product_attention", "nn", "optim", "device_info"]


def device_info(index: int = 0) -> dict:
    """Facts of CUDA device `index` as llmk sees them (``available`` is False without one)."""
    return _C.device_info(index)
