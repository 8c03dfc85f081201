"""Weight-only quantized ops (W4A16, W8A16): ``quantized_linear`` multiplies by a weight
stored as int4 or int8 codes with per-group scales (and optional zero points) in llmk's
packed layout; ``quantize_weight`` (round to nearest) and ``pack_quantized_weight`` (from
codes, as the GPTQ / AWQ importers of :mod:`llmk.quantization` make them) produce it;
``dequantize_weight`` reads it back. C++ kernels: python/src/ops_quantized.cc over
include/llmk/quantized_gemm.h, whose header comment defines the format:

    W[n, k] = (q[n, k] - z[n, k // G]) * s[n, k // G]

in the scales' dtype ((q - z) exact, one rounded multiply), z = 2^(bits-1) without zeros.

Autograd: ``quantized_linear`` gives x (and bias) a gradient, ``dx = dy · W`` on the
dequantized weight (the codes are not trainable), so a frozen quantized base model trains
adapters (QLoRA style).
"""

from typing import Optional, Tuple

import torch

from ._table import define, public

_BITS = (4, 8)


def _check_bits(op: str, bits: int):
    if bits not in _BITS:
        raise ValueError(f"{op}: bits must be 4 or 8, got {bits}")


def _quantized_linear_fake(x, packed, scales, zeros, bits, group_size, bias):
    if x.dim() < 1:
        raise RuntimeError("quantized_linear: x is a 0-d tensor; expected [..., K]")
    if packed.dim() != 2:
        raise RuntimeError(f"quantized_linear: packed has {packed.dim()} dims; expected [N, K * bits / 32]")
    return x.new_empty((*x.shape[:-1], packed.shape[0]))


def _quantized_linear_setup(ctx, inputs, output):
    x, packed, scales, zeros, ctx.bits, ctx.group_size, bias = inputs
    ctx.has_bias = bias is not None
    ctx.save_for_backward(packed, scales, zeros)


def _quantized_linear_grad(ctx, dy):
    packed, scales, zeros = ctx.saved_tensors
    dx = dbias = None
    if ctx.needs_input_grad[0]:
        w = _dequantize(packed, scales, zeros, ctx.bits, ctx.group_size)
        dx = torch.matmul(dy, w)
    if ctx.has_bias and ctx.needs_input_grad[6]:
        dbias = dy.reshape(-1, dy.shape[-1]).sum(0, dtype=torch.float32).to(dy.dtype)
    return dx, None, None, None, None, None, dbias


quantized_linear = define(
    "quantized_linear(Tensor x, Tensor packed, Tensor scales, Tensor? zeros, int bits, int group_size, "
    "Tensor? bias=None) -> Tensor",
    _quantized_linear_fake, setup=_quantized_linear_setup, backward=_quantized_linear_grad,
    doc="``x · dequantize_weight(packed, scales, zeros, bits, group_size)ᵀ + bias`` (fp32 accumulation, one "
        "rounding) without the dequantized weight in memory: the weight-only quantized ``F.linear``. "
        "(int4 on CUDA at up to 16 rows scales each group's fp32 sum of (q - z) x, i.e. multiplies by the "
        "unrounded weight (q - z) s, within half a rounding step of each element of dequantize_weight's.)\n\n"
        "x ``[..., K]`` is float16 or bfloat16 (16-byte aligned rows); packed int32 ``[N, K * bits / 32]`` "
        "(llmk's layout, from :func:`quantize_weight` or the importers of :mod:`llmk.quantization`); scales "
        "``[N, K / group_size]`` of x's dtype; zeros uint8 ``[N, K / group_size]`` or None (symmetric: "
        "z = 2^(bits-1)); bits 4 (group_size a multiple of 128 dividing K) or 8 (a multiple of 64; "
        "group_size = K is per channel); bias ``[N]`` of x's dtype. The output is ``[..., N]`` of x's dtype. "
        "Up to 128 rows a weight-streaming kernel reads the codes (once per 64 rows: decode); more rows "
        "dequantize slabs of the weight into a workspace for the tensor-core GEMM (prefill). With autograd "
        "for x and bias.")


def _dequantize_fake(packed, scales, zeros, bits, group_size):
    if packed.dim() != 2:
        raise RuntimeError(f"dequantize_weight: packed has {packed.dim()} dims; expected [N, K * bits / 32]")
    return packed.new_empty((packed.shape[0], packed.shape[1] * 32 // bits), dtype=scales.dtype)


_dequantize = define(
    "dequantize_weight(Tensor packed, Tensor scales, Tensor? zeros, int bits, int group_size) -> Tensor",
    _dequantize_fake, public=False)

_quantize_inplace = define(
    "quantize_weight_(Tensor weight, Tensor(a!) packed, Tensor(b!) scales, Tensor(c!)? zeros, int bits, "
    "int group_size) -> ()", lambda *args: None, public=False)

_pack = define("pack_quantized_weight(Tensor codes, int bits) -> Tensor",
               lambda codes, bits: codes.new_empty((codes.shape[0], codes.shape[1] * bits // 32), dtype=torch.int32),
               public=False)


@public
def quantize_weight(weight: torch.Tensor, bits: int = 4, group_size: Optional[int] = 128, symmetric: bool = True,
                    dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Round-to-nearest quantization of ``weight [N, K]`` (float32, float16 or bfloat16; an
    ``nn.Linear`` weight) into llmk's layout: returns ``(packed, scales, zeros)`` on weight's
    device, zeros None when ``symmetric``. ``group_size`` None (or K) gives one scale per
    output channel. Symmetric: ``s = max|W| / (2^(bits-1) - 1)`` per group; asymmetric:
    ``s = (max - min) / (2^bits - 1)`` over a range that includes 0, ``z = round(-min / s)``.
    The scales have ``dtype`` (default: weight's, float32 weights give bfloat16). Runs on the
    CPU (a CUDA weight is copied there and the result back)."""
    _check_bits("quantize_weight", bits)
    if weight.dim() != 2:
        raise ValueError(f"quantize_weight: weight must be 2-d [N, K], got shape {tuple(weight.shape)}")
    n, k = weight.shape
    group_size = k if group_size is None else group_size
    if dtype is None:
        dtype = weight.dtype if weight.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"quantize_weight: dtype must be torch.float16 or torch.bfloat16, got {dtype}")
    if group_size <= 0 or k % group_size:
        raise ValueError(f"quantize_weight: group_size {group_size} must divide K = {k}")
    groups = k // group_size
    if weight.is_meta:  # shapes only (torch.compile's fake tensors, meta models)
        return (weight.new_empty((n, k * bits // 32), dtype=torch.int32), weight.new_empty((n, groups), dtype=dtype),
                None if symmetric else weight.new_empty((n, groups), dtype=torch.uint8))
    host = weight.detach().to("cpu").contiguous()
    packed = torch.empty((n, k * bits // 32), dtype=torch.int32)
    scales = torch.empty((n, groups), dtype=dtype)
    zeros = None if symmetric else torch.empty((n, groups), dtype=torch.uint8)
    _quantize_inplace(host, packed, scales, zeros, bits, group_size)
    device = weight.device
    return packed.to(device), scales.to(device), None if zeros is None else zeros.to(device)


@public
def pack_quantized_weight(codes: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """Packs integer codes ``[N, K]`` (each in ``[0, 2^bits)``, any integer dtype) into llmk's
    layout (int32 ``[N, K * bits / 32]``, on codes' device). For importers of other formats."""
    _check_bits("pack_quantized_weight", bits)
    if codes.dim() != 2:
        raise ValueError(f"pack_quantized_weight: codes must be 2-d [N, K], got shape {tuple(codes.shape)}")
    if codes.is_meta:
        return codes.new_empty((codes.shape[0], codes.shape[1] * bits // 32), dtype=torch.int32)
    host = codes.detach().to("cpu")
    if host.dtype != torch.uint8:
        if host.numel() and (int(host.min()) < 0 or int(host.max()) >= (1 << bits)):
            raise ValueError(f"pack_quantized_weight: codes must lie in [0, {1 << bits}), got "
                             f"[{int(host.min())}, {int(host.max())}]")
        host = host.to(torch.uint8)
    return _pack(host.contiguous(), bits).to(codes.device)


@public
def dequantize_weight(packed: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor], bits: int,
                      group_size: int) -> torch.Tensor:
    """The weight ``[N, K]`` (the scales' dtype) that :func:`quantized_linear` multiplies by:
    ``(q - z) * s`` per group, exactly as the kernels compute it (CPU or CUDA)."""
    return _dequantize(packed, scales, zeros, bits, group_size)
