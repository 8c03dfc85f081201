"""Weight-only quantized models on llmk: importers of GPTQ and AWQ checkpoints, the
:class:`QuantizedLinear` module and :func:`quantize_model` (round to nearest, no calibration).

llmk's format (include/llmk/quantized_gemm.h defines it; python/llmk/ops/quantized.py has the
ops). A weight ``W [N, K]`` (``nn.Linear``'s layout: N outputs, K inputs) is kept as

- ``packed`` int32 ``[N, K * bits / 32]``: codes ``q`` in ``[0, 2^bits)`` in llmk's own
  order of k inside each 512-bit block (written by :func:`llmk.pack_quantized_weight`);
- ``scales`` ``[N, K / G]`` in the activations' dtype (float16 or bfloat16);
- ``zeros`` uint8 ``[N, K / G]``, or None for ``z = 2^(bits - 1)`` (8 for int4, 128 for int8);

    W[n, k] = (q[n, k] - z[n, k // G]) * s[n, k // G]

with ``(q - z)`` exact and one rounded multiply in the scales' dtype. int4 needs K a multiple
of 128 and G a multiple of 128 dividing K; int8 needs 64 for both. G = K is one scale per
output channel.

GPTQ (AutoGPTQ / GPTQModel / transformers' ``GPTQConfig``, the torch and exllama kernels'
layout; :func:`from_gptq`), with ``P = 32 / bits`` codes per int32 word:

- ``qweight`` int32 ``[K / P, N]``, packed along K: bits ``[i*bits, (i+1)*bits)`` of
  ``qweight[r, n]`` hold ``q`` of input ``k = P*r + i`` (the lowest bits hold the first k);
- ``qzeros`` int32 ``[K / G, N / P]``, packed along N the same way;
- ``scales`` float16 ``[K / G, N]``, ``g_idx`` int32 ``[K]`` (the group of each input k);
- ``W[n, k] = (q - (z_stored + 1)) * s``: the classic ("v1") format stores ``z - 1`` and the
  kernels add the 1 back. GPTQModel's ``checkpoint_format: "gptq_v2"`` stores ``z`` itself:
  pass ``zero_offset=0``. ``g_idx`` is the trivial ``arange(K) // G`` unless the checkpoint
  was made with ``desc_act=True`` (act order) *and* saved unreordered; then its groups are
  not contiguous runs of k. llmk imports such a weight with its inputs sorted by group (a
  stable sort of ``g_idx``: each group a contiguous run again) and keeps that order as
  ``input_order``; the layer gathers ``x[..., input_order]`` before the product (one gather
  of the activations per call, the weight untouched). Every group must hold ``G`` inputs.

AWQ (AutoAWQ's ``version: "gemm"``, also what vLLM and transformers load as ``awq``;
:func:`from_awq`), 4 bits only:

- ``qweight`` int32 ``[K, N / 8]``, packed along N with an interleave: nibble ``j`` (bits
  ``4j .. 4j+3``) of ``qweight[k, c]`` holds column ``n = 8c + ORDER[j]``, ``ORDER = [0, 2, 4,
  6, 1, 3, 5, 7]``;
- ``qzeros`` int32 ``[K / G, N / 8]``, packed the same way; ``scales`` float16 ``[K / G, N]``;
- ``W[n, k] = (q - z) * s`` (no offset).

AWQ's GEMV layout and GPTQ's 2/3-bit and Marlin layouts are not read. The importers do their
unpacking with torch on the tensors' device and pack llmk's layout on the CPU; the results
are on qweight's device.

Symmetric checkpoints still store a zero point (GPTQ: 8 for int4, stored as 7 in v1); an
imported weight whose zero points are all ``2^(bits-1)`` gets ``zeros=None``, which is the
same weight with less memory traffic.
"""

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterable, NamedTuple, Optional, Tuple

import torch
from torch import nn

from . import ops
from .ops import dequantize_weight, pack_quantized_weight, quantize_weight

__all__ = ["QuantizedTensors", "from_gptq", "from_awq", "QuantizedLinear", "quantize_model",
           "load_quantized_state_dict", "fuse_rows", "parse_scheme", "layout_problem"]

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble j of an AWQ word holds column AWQ_ORDER[j] of its 8
_HALF = (torch.float16, torch.bfloat16)


class QuantizedTensors(NamedTuple):
    """A weight in llmk's format: the arguments of :func:`llmk.quantized_linear` after x, and
    for an act-order GPTQ import the order of the inputs the packed weight expects:
    ``quantized_linear(x[..., input_order], ...)`` is the layer's product."""
    packed: torch.Tensor  # int32 [N, K * bits / 32]
    scales: torch.Tensor  # [N, K / group_size], float16 or bfloat16
    zeros: Optional[torch.Tensor]  # uint8 [N, K / group_size], or None: 2^(bits - 1)
    bits: int
    group_size: int
    input_order: Optional[torch.Tensor] = None  # int64 [K]: packed input j is the layer's input input_order[j]

    @property
    def in_features(self) -> int:
        return self.packed.shape[1] * 32 // self.bits

    @property
    def out_features(self) -> int:
        return self.packed.shape[0]

    def dequantize(self) -> torch.Tensor:
        """The layer's weight ``[N, K]`` (columns in the layer's input order)."""
        return _in_input_order(dequantize_weight(self.packed, self.scales, self.zeros, self.bits, self.group_size),
                               self.input_order)


def _in_input_order(weight: torch.Tensor, input_order: Optional[torch.Tensor]) -> torch.Tensor:
    """The packed weight's columns put back in the layer's input order."""
    if input_order is None:
        return weight
    out = torch.empty_like(weight)
    out[:, input_order] = weight
    return out


# -- the format's constraints ---------------------------------------------------------------


def _block(bits: int) -> int:
    """The granularity of K and of the group size: 128 codes for int4, 64 for int8."""
    return 128 if bits == 4 else 64


def layout_problem(in_features: int, bits: int, group_size: Optional[int]) -> Optional[str]:
    """Why a weight of ``in_features`` inputs cannot take llmk's ``bits``/``group_size``
    format, or None when it can (``group_size`` None is per channel)."""
    if bits not in (4, 8):
        return f"bits must be 4 or 8, got {bits}"
    block = _block(bits)
    if in_features <= 0 or in_features % block:
        return f"int{bits} needs in_features a multiple of {block}, got {in_features}"
    group = in_features if group_size is None else group_size
    if group <= 0 or group % block or in_features % group:
        return (f"int{bits} needs group_size a multiple of {block} that divides in_features = {in_features}, "
                f"got {group}")
    return None


def _require_layout(where: str, in_features: int, bits: int, group_size: Optional[int]) -> None:
    problem = layout_problem(in_features, bits, group_size)
    if problem is not None:
        raise ValueError(f"{where}: {problem}")


def _scale_dtype(where: str, scales: torch.Tensor, dtype: Optional[torch.dtype]) -> torch.dtype:
    """The dtype of the imported scales: ``dtype``, else the checkpoint's (float32: bfloat16)."""
    if dtype is None:
        dtype = scales.dtype if scales.dtype in _HALF else torch.bfloat16
    if dtype not in _HALF:
        raise ValueError(f"{where}: dtype must be torch.float16 or torch.bfloat16 (the activations' dtype), "
                         f"got {dtype}")
    return dtype


# -- unpacking other formats ------------------------------------------------------------------


def _check_words(where: str, name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.dtype != torch.int32:
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{where}: {name} must be a 2-d int32 tensor, got {got}")


def _unpack(words: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """uint8 codes from int32 words packed along ``dim``: value i of a word (bits ``i*bits``
    and up) goes to index ``word * (32 / bits) + i`` of ``dim``."""
    per, mask = 32 // bits, (1 << bits) - 1
    w = words.movedim(dim, -1)
    out = torch.empty((*w.shape, per), dtype=torch.uint8, device=w.device)
    for i in range(per):
        out[..., i] = (w >> (bits * i)) & mask  # the arithmetic shift's sign bits are masked off
    return out.flatten(-2).movedim(-1, dim)


def _assemble(where: str, codes_kn: torch.Tensor, zeros_gn: torch.Tensor, scales_gn: torch.Tensor, bits: int,
              group_size: int, dtype: torch.dtype) -> QuantizedTensors:
    """llmk's tensors from codes [K, N], zero points [K/G, N] (integers) and scales [K/G, N]."""
    if zeros_gn.numel() and (int(zeros_gn.min()) < 0 or int(zeros_gn.max()) >= (1 << bits)):
        raise ValueError(f"{where}: zero points must lie in [0, {1 << bits}) after the offset, got "
                         f"[{int(zeros_gn.min())}, {int(zeros_gn.max())}] (a GPTQ checkpoint whose checkpoint_format "
                         f"is 'gptq_v2' needs zero_offset=0; a v1 checkpoint with a zero point of 0 was packed "
                         f"wrongly by its quantizer and cannot be read)")
    packed = pack_quantized_weight(codes_kn.t(), bits)
    scales = scales_gn.t().to(dtype).contiguous()
    if bool((zeros_gn == (1 << (bits - 1))).all()):
        zeros = None
    else:
        zeros = zeros_gn.t().to(torch.uint8).contiguous()
    return QuantizedTensors(packed, scales, zeros, bits, group_size)


def _group_size(where: str, k: int, groups: int, group_size: Optional[int]) -> int:
    """The group size, inferred from the scales' rows when not given (-1: per channel)."""
    if group_size is None or group_size == -1:
        if groups <= 0 or k % groups:
            raise ValueError(f"{where}: scales have {groups} rows, which does not divide K = {k} into groups")
        return k // groups
    if group_size <= 0 or k % group_size or k // group_size != groups:
        raise ValueError(f"{where}: group_size {group_size} with K = {k} gives {k / group_size:g} groups, but "
                         f"scales have {groups} rows")
    return group_size


def from_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: Optional[torch.Tensor] = None,
              bits: int = 4, group_size: Optional[int] = None, dtype: Optional[torch.dtype] = None,
              zero_offset: int = 1) -> QuantizedTensors:
    """A GPTQ layer's tensors (see the module docstring) in llmk's format.

    ``qweight`` int32 ``[K * bits / 32, N]``, ``qzeros`` int32 ``[K / G, N * bits / 32]``,
    ``scales`` ``[K / G, N]``, ``g_idx`` int32 ``[K]`` or None; bits 4 or 8. ``group_size``
    None (or -1, GPTQ's per channel) is inferred from the scales. ``dtype`` is the scales'
    (default: the checkpoint's; convert float16 scales to bfloat16 only for a bfloat16 model,
    as it rounds them). ``zero_offset`` is added to the stored zero points: 1 for the classic
    format, 0 for GPTQModel's ``checkpoint_format: "gptq_v2"``. An act-order (``desc_act``)
    ``g_idx`` that is not ``arange(K) // G`` gives the result an ``input_order`` (see the
    module docstring); ValueError when its groups do not each hold ``group_size`` inputs.
    """
    where = "from_gptq"
    if bits not in (4, 8):
        raise ValueError(f"{where}: llmk reads 4- and 8-bit GPTQ weights, got bits={bits}")
    _check_words(where, "qweight", qweight)
    _check_words(where, "qzeros", qzeros)
    per = 32 // bits
    k, n = qweight.shape[0] * per, qweight.shape[1]
    if scales.dim() != 2 or scales.shape[1] != n:
        raise ValueError(f"{where}: scales must be [K / group_size, N] with N = {n} (qweight's columns), got "
                         f"{tuple(scales.shape)}")
    group_size = _group_size(where, k, scales.shape[0], group_size)
    groups = k // group_size
    if qzeros.shape != (groups, math.ceil(n / per)):
        raise ValueError(f"{where}: qzeros must be [K / group_size, N * bits / 32] = [{groups}, {math.ceil(n / per)}], "
                         f"got {tuple(qzeros.shape)}")
    order = None if g_idx is None else _act_order(where, g_idx, k, group_size)
    _require_layout(where, k, bits, group_size)
    dtype = _scale_dtype(where, scales, dtype)
    codes = _unpack(qweight, bits, 0)  # [K, N]
    if order is not None:
        codes = codes[order]  # row j: input order[j], whose group is j // G
    zeros = _unpack(qzeros, bits, 1)[:, :n].to(torch.int16) + zero_offset  # [K / G, N]
    return _assemble(where, codes, zeros, scales, bits, group_size, dtype)._replace(input_order=order)


def _act_order(where: str, g_idx: torch.Tensor, k: int, group_size: int) -> Optional[torch.Tensor]:
    """The inputs sorted by group (stable) when ``g_idx`` is not ``arange(K) // G``, else None."""
    if not isinstance(g_idx, torch.Tensor) or g_idx.shape != (k,) or g_idx.dtype.is_floating_point \
            or g_idx.dtype == torch.bool:
        got = f"{g_idx.dtype} {tuple(g_idx.shape)}" if isinstance(g_idx, torch.Tensor) else type(g_idx).__name__
        raise ValueError(f"{where}: g_idx must be an integer tensor [K] = [{k}] (the group of each input), got {got}")
    groups = g_idx.to(torch.int64)
    trivial = torch.arange(k, device=groups.device) // group_size
    if torch.equal(groups, trivial):
        return None
    count = k // group_size
    if int(groups.min()) < 0 or int(groups.max()) >= count or \
            bool((torch.bincount(groups, minlength=count) != group_size).any()):
        raise ValueError(f"{where}: this act-order (desc_act=True) g_idx does not give each of the {count} "
                         f"groups {group_size} inputs (group ids {int(groups.min())}..{int(groups.max())}); llmk "
                         f"needs groups of equal size to sort them into contiguous runs")
    return torch.argsort(groups, stable=True)


def _awq_columns(t: torch.Tensor) -> torch.Tensor:
    """uint8 [R, N] in column order from AWQ's words [R, N / 8]."""
    codes = _unpack(t, 4, 1)  # index 8c + j holds column 8c + AWQ_ORDER[j]
    inverse = torch.tensor(sorted(range(8), key=lambda j: AWQ_ORDER[j]), device=t.device)  # column m <- nibble
    index = (torch.arange(t.shape[1], device=t.device)[:, None] * 8 + inverse).flatten()
    return codes[:, index]


def from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, bits: int = 4,
             group_size: Optional[int] = None, dtype: Optional[torch.dtype] = None) -> QuantizedTensors:
    """An AutoAWQ GEMM layer's tensors (see the module docstring) in llmk's format.

    ``qweight`` int32 ``[K, N / 8]``, ``qzeros`` int32 ``[K / G, N / 8]``, ``scales``
    ``[K / G, N]``; bits must be 4. ``group_size`` None is inferred from the scales;
    ``dtype`` as in :func:`from_gptq`.
    """
    where = "from_awq"
    if bits != 4:
        raise ValueError(f"{where}: AWQ's GEMM format is 4-bit, got bits={bits}")
    _check_words(where, "qweight", qweight)
    _check_words(where, "qzeros", qzeros)
    k, n = qweight.shape[0], qweight.shape[1] * 8
    if scales.dim() != 2 or scales.shape[1] != n:
        raise ValueError(f"{where}: scales must be [K / group_size, N] with N = {n} (8 x qweight's columns), got "
                         f"{tuple(scales.shape)}")
    group_size = _group_size(where, k, scales.shape[0], group_size)
    if qzeros.shape != (k // group_size, n // 8):
        raise ValueError(f"{where}: qzeros must be [K / group_size, N / 8] = [{k // group_size}, {n // 8}], got "
                         f"{tuple(qzeros.shape)}")
    _require_layout(where, k, bits, group_size)
    dtype = _scale_dtype(where, scales, dtype)
    return _assemble(where, _awq_columns(qweight), _awq_columns(qzeros), scales, bits, group_size, dtype)


# -- the module -------------------------------------------------------------------------------


class QuantizedLinear(nn.Module):
    """``nn.Linear`` with a weight-only quantized weight: ``forward(x)`` is
    :func:`llmk.quantized_linear` (x float16 or bfloat16, the scales' dtype; CPU or CUDA).

    Buffers ``packed``, ``scales``, ``zeros`` (None when symmetric: not in the state dict) and
    ``input_order`` (an act-order GPTQ import's int64 ``[in_features]``: forward multiplies
    ``x[..., input_order]`` by the packed weight; None otherwise, not in the state dict),
    parameter ``bias`` (or None). The constructor makes empty tensors of the right shapes, as
    ``nn.Linear`` does, to load a state dict into (``act_order=True`` for an ``input_order``);
    :meth:`from_linear`, :meth:`from_gptq` and :meth:`from_awq` build filled ones.
    ``module.to(dtype)`` converts the scales and bias (keep them float16 or bfloat16).
    """

    def __init__(self, in_features: int, out_features: int, bits: int = 4, group_size: Optional[int] = 128,
                 bias: bool = True, zeros: bool = False, device=None, dtype: torch.dtype = torch.bfloat16,
                 act_order: bool = False):
        super().__init__()
        group_size = in_features if group_size is None else group_size
        _require_layout("QuantizedLinear", in_features, bits, group_size)
        if dtype not in _HALF:
            raise ValueError(f"QuantizedLinear: dtype must be torch.float16 or torch.bfloat16, got {dtype}")
        self.in_features, self.out_features = in_features, out_features
        self.bits, self.group_size = bits, group_size
        groups = in_features // group_size
        self.register_buffer("packed", torch.empty(out_features, in_features * bits // 32, dtype=torch.int32,
                                                   device=device))
        self.register_buffer("scales", torch.empty(out_features, groups, dtype=dtype, device=device))
        self.register_buffer("zeros", torch.empty(out_features, groups, dtype=torch.uint8, device=device)
                             if zeros else None)
        self.register_buffer("input_order", torch.empty(in_features, dtype=torch.int64, device=device)
                             if act_order else None)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_order is not None:
            x = x.index_select(-1, self.input_order)
        return ops.quantized_linear(x, self.packed, self.scales, self.zeros, self.bits, self.group_size, self.bias)

    def dequantize(self) -> torch.Tensor:
        """The weight ``[out_features, in_features]`` that forward multiplies x by (columns in
        x's order)."""
        return _in_input_order(dequantize_weight(self.packed, self.scales, self.zeros, self.bits, self.group_size),
                               self.input_order)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
                f"group_size={self.group_size}, zeros={self.zeros is not None}, bias={self.bias is not None}"
                + (", act_order=True" if self.input_order is not None else ""))

    @classmethod
    def from_tensors(cls, tensors: QuantizedTensors, bias: Optional[torch.Tensor] = None) -> "QuantizedLinear":
        """The module over ``tensors`` (shared, not copied); ``bias`` ``[N]`` is converted to
        the scales' dtype (a Parameter is kept as it is when it already has it)."""
        packed, scales, zeros, bits, group_size, input_order = tensors
        n, k = packed.shape[0], packed.shape[1] * 32 // bits
        if input_order is not None and (input_order.shape != (k,) or input_order.dtype != torch.int64
                                        or input_order.device != packed.device):
            raise ValueError(f"QuantizedLinear: input_order must be int64 [in_features] = [{k}] on {packed.device}, "
                             f"got {input_order.dtype} {tuple(input_order.shape)} on {input_order.device}")
        new = cls(k, n, bits, group_size, bias=False, device="meta", dtype=scales.dtype)
        new.packed, new.scales, new.zeros, new.input_order = packed, scales, zeros, input_order
        if bias is not None:
            if bias.shape != (n,):
                raise ValueError(f"QuantizedLinear: bias must be [out_features] = [{n}], got {tuple(bias.shape)}")
            if not (isinstance(bias, nn.Parameter) and bias.dtype == scales.dtype and bias.device == packed.device):
                bias = nn.Parameter(bias.detach().to(packed.device, scales.dtype),
                                    requires_grad=bias.requires_grad)
            new.bias = bias
        return new

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 4, group_size: Optional[int] = 128,
                    symmetric: bool = True) -> "QuantizedLinear":
        """Round-to-nearest quantization of ``linear``'s weight (:func:`llmk.quantize_weight`),
        keeping its bias (the same Parameter). The weight must be float16 or bfloat16: the
        scales take its dtype, and forward takes x of that dtype. ``group_size`` None: per
        channel."""
        weight = linear.weight
        if weight.dtype not in _HALF:
            raise ValueError(f"QuantizedLinear.from_linear: the weight is {weight.dtype}; llmk's quantized linear "
                             f"computes in float16 or bfloat16 (convert the model first: model.to(torch.bfloat16))")
        k = weight.shape[1]
        group_size = k if group_size is None else group_size
        _require_layout("QuantizedLinear.from_linear", k, bits, group_size)
        packed, scales, zeros = quantize_weight(weight.detach(), bits, group_size, symmetric=symmetric,
                                                dtype=weight.dtype)
        return cls.from_tensors(QuantizedTensors(packed, scales, zeros, bits, group_size), linear.bias)

    @classmethod
    def from_gptq(cls, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                  g_idx: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None, bits: int = 4,
                  group_size: Optional[int] = None, dtype: Optional[torch.dtype] = None,
                  zero_offset: int = 1) -> "QuantizedLinear":
        """The module of a GPTQ layer's tensors: see :func:`from_gptq`."""
        return cls.from_tensors(from_gptq(qweight, qzeros, scales, g_idx, bits, group_size, dtype, zero_offset), bias)

    @classmethod
    def from_awq(cls, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                 bias: Optional[torch.Tensor] = None, bits: int = 4, group_size: Optional[int] = None,
                 dtype: Optional[torch.dtype] = None) -> "QuantizedLinear":
        """The module of an AutoAWQ GEMM layer's tensors: see :func:`from_awq`."""
        return cls.from_tensors(from_awq(qweight, qzeros, scales, bits, group_size, dtype), bias)


# -- whole models -----------------------------------------------------------------------------


def fuse_rows(modules) -> Optional[QuantizedLinear]:
    """One QuantizedLinear over the output rows of ``modules`` (QuantizedLinear layers of one
    input, format, dtype and device, all with a bias or none), for one launch where a model
    makes several (q, k and v; gate and up); each module's buffers and bias then become views
    of the fused ones' rows (no second copy). None when the modules do not agree (act-order
    imports too: they must share one input order)."""
    first = modules[0]

    def same_order(m):
        if m.input_order is None or first.input_order is None:
            return m.input_order is None and first.input_order is None
        return torch.equal(m.input_order, first.input_order)

    same = all(isinstance(m, QuantizedLinear) and m.in_features == first.in_features and m.bits == first.bits
               and m.group_size == first.group_size and m.scales.dtype == first.scales.dtype
               and m.packed.device == first.packed.device and (m.zeros is None) == (first.zeros is None)
               and (m.bias is None) == (first.bias is None) and same_order(m) for m in modules)
    if not same:
        return None
    cat = lambda name: torch.cat([getattr(m, name).detach() for m in modules])  # noqa: E731
    fused = QuantizedLinear.from_tensors(QuantizedTensors(
        cat("packed"), cat("scales"), None if first.zeros is None else cat("zeros"), first.bits, first.group_size,
        first.input_order), None if first.bias is None else cat("bias"))
    row = 0
    for m in modules:
        rows = slice(row, row + m.out_features)
        m.packed, m.scales = fused.packed[rows], fused.scales[rows]
        if m.zeros is not None:
            m.zeros = fused.zeros[rows]
        if m.bias is not None:
            m.bias = nn.Parameter(fused.bias[rows], requires_grad=m.bias.requires_grad)
        row += m.out_features
    return fused


_QUANTIZED_KEYS = ("qweight", "qzeros", "scales", "g_idx", "bias")


def load_quantized_state_dict(model: nn.Module, state_dict: Dict[str, torch.Tensor],
                              quantization_config: Dict[str, object]) -> Dict[str, object]:
    """Loads a GPTQ or AWQ checkpoint into ``model`` without the GPTQ / AWQ packages: the
    checkpoint's tensors as saved (``safetensors.torch.load_file`` of its shards, merged) and its
    ``config.json``'s ``quantization_config``. ``model`` is the architecture in float16 or
    bfloat16 (``AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)``; its own
    weights are replaced): every ``nn.Linear`` whose name has ``qweight``, ``qzeros`` and
    ``scales`` in the checkpoint becomes a :class:`QuantizedLinear` of them (scales in the
    Linear's dtype, on its device), every other tensor loads as ``load_state_dict`` loads it.

    ``quantization_config``: ``quant_method`` "gptq" (``bits`` 4 or 8, ``group_size``,
    ``checkpoint_format`` "gptq" (zero points stored minus one) or "gptq_v2"; act-order
    ``g_idx`` taken as :func:`from_gptq` takes it) or "awq" (``bits`` / ``w_bit`` 4, ``version`` "gemm"). Every
    model tensor must come from the checkpoint and every checkpoint tensor must be used, else
    ValueError naming them. Returns ``{"quantized": [names], "loaded": [names]}``."""
    where = "load_quantized_state_dict"
    method = str(quantization_config.get("quant_method", "")).lower()
    bits = int(quantization_config.get("bits", quantization_config.get("w_bit", 4)))
    group = quantization_config.get("group_size", quantization_config.get("q_group_size"))
    group = None if group in (None, -1) else int(group)
    if method == "gptq":
        fmt = str(quantization_config.get("checkpoint_format", "gptq")).lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise ValueError(f"{where}: GPTQ checkpoint_format {fmt!r} is not read (only 'gptq' and 'gptq_v2')")
        offset = 0 if fmt == "gptq_v2" else 1
    elif method == "awq":
        version = str(quantization_config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"{where}: AWQ version {version!r} is not read (only 'gemm')")
    else:
        raise ValueError(f"{where}: quant_method {method!r} is not read (only 'gptq' and 'awq')")
    prefixes = [key[: -len(".qweight")] for key in state_dict if key.endswith(".qweight")]
    report = {"quantized": [], "loaded": []}
    used = set()
    for prefix in prefixes:
        try:
            linear = model.get_submodule(prefix)
        except AttributeError:
            raise ValueError(f"{where}: the checkpoint quantizes {prefix!r}, which the model does not have") from None
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"{where}: {prefix!r} is a {type(linear).__name__} in the model, not an nn.Linear")
        t = {key: state_dict.get(f"{prefix}.{key}") for key in _QUANTIZED_KEYS}
        if t["qzeros"] is None or t["scales"] is None:
            raise ValueError(f"{where}: {prefix!r} has a qweight but no qzeros or scales")
        device, dtype = linear.weight.device, linear.weight.dtype
        moved = {key: None if v is None else v.to(device) for key, v in t.items()}
        if method == "gptq":
            new = QuantizedLinear.from_gptq(moved["qweight"], moved["qzeros"], moved["scales"], moved["g_idx"],
                                            moved["bias"], bits, group, dtype, offset)
        else:
            new = QuantizedLinear.from_awq(moved["qweight"], moved["qzeros"], moved["scales"], moved["bias"], bits,
                                           group, dtype)
        if (new.in_features, new.out_features) != (linear.in_features, linear.out_features):
            raise ValueError(f"{where}: {prefix!r} is [{new.out_features}, {new.in_features}] in the checkpoint but "
                             f"[{linear.out_features}, {linear.in_features}] in the model")
        if (linear.bias is None) != (new.bias is None):
            raise ValueError(f"{where}: {prefix!r} has {'no ' if new.bias is None else 'a '}bias in the checkpoint, "
                             f"the model's layer {'has' if linear.bias is not None else 'has none'}")
        parent, _, child = prefix.rpartition(".")
        setattr(model.get_submodule(parent), child, new)
        report["quantized"].append(prefix)
        used.update(f"{prefix}.{key}" for key, v in t.items() if v is not None)
    rest = {key: v for key, v in state_dict.items() if key not in used}
    missing, unexpected = model.load_state_dict(rest, strict=False)
    ours = {f"{p}.{b}" for p in report["quantized"] for b in ("packed", "scales", "zeros", "input_order", "bias")}
    # a tied parameter (lm_head.weight = embed_tokens.weight) is loaded under its other name
    params = dict(model.named_parameters(remove_duplicate=False))
    tied = {key for key in missing if any(params.get(key) is params.get(other) for other in rest if other != key)}
    missing = [key for key in missing if key not in ours and key not in tied]
    if missing or unexpected:
        raise ValueError(f"{where}: the checkpoint does not match the model: missing {missing[:8]}"
                         f"{' ...' if len(missing) > 8 else ''}, unexpected {list(unexpected)[:8]}"
                         f"{' ...' if len(unexpected) > 8 else ''}")
    report["loaded"] = sorted(rest)
    return report


def parse_scheme(scheme: str) -> Tuple[int, Optional[int]]:
    """``(bits, group_size)`` of a scheme name, group_size None for per channel: "int4-g128",
    "int4-g<G>", "int4" (per channel), "int8" (per channel), "int8-g<G>"."""
    name = scheme.strip().lower()
    base, _, group = name.partition("-g")
    if base not in ("int4", "int8") or (group and not group.isdigit()):
        raise ValueError(f"quantize_model: unknown scheme {scheme!r}; expected 'int4-g128', 'int4-g<G>', 'int4', "
                         f"'int8' or 'int8-g<G>'")
    bits = int(base[3:])
    group_size = int(group) if group else None
    if group_size is not None and (group_size <= 0 or group_size % _block(bits)):
        raise ValueError(f"quantize_model: scheme {scheme!r}: int{bits} groups are multiples of {_block(bits)}")
    return bits, group_size


def _is_dtensor(t: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without distributed
        return type(t).__name__ == "DTensor"
    return isinstance(t, DTensor)


def _storage_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers (this rank's shard of a DTensor), each
    storage counted once."""
    seen, total = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if _is_dtensor(t):
            t = t.to_local()
        if t.device.type == "meta":
            total += t.numel() * t.element_size()
            continue
        try:
            storage = t.untyped_storage()
            key = (t.device, storage.data_ptr())
        except (RuntimeError, NotImplementedError):  # meta tensors, subclasses without storage
            total += t.numel() * t.element_size()
            continue
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def _skipped_by_name(name: str, skip: Iterable[str]) -> bool:
    """Whether a pattern of ``skip`` is a run of whole components of the dotted name:
    "lm_head" matches "model.lm_head", "layers.0" every linear of "model.layers.0", "mlp"
    every MLP's linears; "head" matches neither "lm_head" nor "model.lm_head"."""
    parts = name.split(".")
    for pattern in skip:
        p = pattern.split(".")
        if any(parts[i:i + len(p)] == p for i in range(len(parts) - len(p) + 1)):
            return True
    return False


def _why_not(name: str, module: nn.Linear, bits: int, group_size: Optional[int], skip: Iterable[str]) -> Optional[str]:
    """Why quantize_model leaves this nn.Linear as it is, or None."""
    if name == "":
        return "the model itself is the nn.Linear (quantize_model replaces submodules; use QuantizedLinear.from_linear)"
    if _skipped_by_name(name, skip):
        return "skipped by name (skip=...)"
    if type(module) is not nn.Linear:
        return f"{type(module).__name__} is a subclass of nn.Linear (its forward or weight may differ)"
    weight = module.weight
    if _is_dtensor(weight):
        return "the weight is a DTensor (tensor parallel / sharded): quantize the whole weight before sharding"
    forward = module.__dict__.get("forward")
    if forward is not None and not getattr(forward, "_llmk", False):
        return ("its forward is replaced on the instance (transformers' tensor-parallel forward, or an accelerate "
                "hook): the weight may be sharded or offloaded")
    if module._forward_hooks or module._forward_pre_hooks:
        return "it has forward hooks, which a replacement module would not run"
    if weight.device.type == "meta":
        return "the weight is on the meta device (load the model's weights first)"
    if weight.dtype not in _HALF:
        return (f"the weight is {weight.dtype}; quantized linear computes in float16 or bfloat16 (convert the "
                f"model first)")
    return layout_problem(module.in_features, bits, group_size)


def quantize_model(model: nn.Module, scheme: str = "int4-g128", skip: Iterable[str] = ("lm_head",),
                   symmetric: bool = True) -> Dict[str, object]:
    """Replaces every ``nn.Linear`` of ``model`` (in place) by a :class:`QuantizedLinear` of its
    weight, round to nearest (no calibration; for GPTQ/AWQ quality import a checkpoint with
    :meth:`QuantizedLinear.from_gptq` / :meth:`~QuantizedLinear.from_awq`).

    ``scheme``: "int4-g128" (int4, groups of 128, the default), "int4-g<G>" (G a multiple of
    128), "int4" (int4 per channel), "int8" (int8 per channel), "int8-g<G>" (G a multiple of
    64); ``symmetric=False`` adds zero points. ``skip``: names of modules left alone, each
    matching a run of whole components of a dotted name ("lm_head" matches "model.lm_head",
    "layers.0" everything in "model.layers.0"). Also left alone, with the reason in the
    report: nn.Linear subclasses, DTensor (tensor-parallel) weights or a forward replaced on
    the instance (transformers' tensor parallelism, accelerate's hooks), forward hooks, meta
    or float32 weights, in_features that do not fit the format.

    Returns ``{"quantized": [names], "skipped": {name: reason}, "bytes_before": int,
    "bytes_after": int}``, the bytes being those of all the model's parameters and buffers.
    """
    bits, group_size = parse_scheme(scheme)
    skip = (skip,) if isinstance(skip, str) else tuple(skip)
    report = {"quantized": [], "skipped": {}, "bytes_before": _storage_bytes(model), "bytes_after": 0}
    # A module reachable under several names is decided once, by its first name: replaced
    # everywhere by one QuantizedLinear, or left everywhere with one reason. The quantization
    # itself (host C++, which releases the GIL) runs on a thread per CPU core, up to 16.
    linears = [(name, m) for name, m in model.named_modules(remove_duplicate=False) if isinstance(m, nn.Linear)]
    decided: Dict[int, object] = {}
    for name, module in linears:
        if id(module) not in decided:
            decided[id(module)] = _why_not(name, module, bits, group_size, skip)
    todo = [m for name, m in dict((id(m), (n, m)) for n, m in linears).values() if decided[id(m)] is None]
    with ThreadPoolExecutor(max_workers=max(1, min(16, os.cpu_count() or 1, len(todo)))) as pool:
        for module, new in zip(todo, pool.map(lambda m: QuantizedLinear.from_linear(m, bits, group_size, symmetric),
                                               todo)):
            decided[id(module)] = new
    for name, module in linears:
        outcome = decided[id(module)]
        if isinstance(outcome, str):
            report["skipped"][name] = outcome
            continue
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, outcome)
        report["quantized"].append(name)
    report["bytes_after"] = _storage_bytes(model)
    return report
