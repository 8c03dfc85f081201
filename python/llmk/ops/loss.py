"""Cross-entropy over vocabulary logits: per-row loss and log-sum-exp in one pass over the
logits, the gradient in one more (cross_entropy_backward, from the forward's lse) or in the same
pass over the logits' own buffer (cross_entropy_grad_), and the public cross_entropy with
PyTorch's reductions. C++ kernels: python/src/ops_loss.cc over include/llmk/loss.h (its
header comment has the formulas: ignore_index, label smoothing, z-loss).

fused_linear_cross_entropy (public, no op of its own): the LM head's llmk.linear and the
cross-entropy in chunks of tokens, without the [tokens, vocab] logits in memory, with autograd
(an autograd.Function over the ops; see its docstring and docs/kernels/cross_entropy.md)."""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._table import define, public, rows_f32
from .gemm import _aligned, linear

_ARGS = "int ignore_index=-100, float label_smoothing=0.0, float z_loss=0.0"


def _loss_and_lse(logits, *unused):
    return rows_f32(logits), rows_f32(logits)


def _setup(ctx, inputs, output):
    logits, target, *ctx.args = inputs
    ctx.save_for_backward(logits, target, output[1])
    ctx.mark_non_differentiable(output[1])


def _grad(ctx, dloss, dlse):
    logits, target, lse = ctx.saved_tensors
    return (cross_entropy_backward(dloss, logits, target, lse, *ctx.args), None) + (None,) * len(ctx.args)


_cross_entropy = define(
    f"cross_entropy(Tensor logits, Tensor target, {_ARGS}) -> (Tensor, Tensor)",
    _loss_and_lse, setup=_setup, backward=_grad, public=False)

# The rows' loss and lse, and the gradient of their sum (grad_scale 1) written over the logits in the
# same pass. No autograd of its own: cross_entropy(grad_in_logits=True) wraps it in _CrossEntropyGradInLogits.
_cross_entropy_grad_ = define(
    f"cross_entropy_grad_(Tensor(a!) logits, Tensor target, {_ARGS}) -> (Tensor, Tensor)",
    _loss_and_lse, public=False)

cross_entropy_backward = define(
    f"cross_entropy_backward(Tensor dloss, Tensor logits, Tensor target, Tensor lse, {_ARGS}) -> Tensor",
    lambda dloss, logits, *args: logits.new_empty(logits.shape),
    doc="The gradient of the logits from the rows' upstream gradient ``dloss`` (float32 [tokens]) and the "
        "forward's ``lse``: one pass over the logits, zero on ignored rows.")

_REDUCTIONS = ("none", "sum", "mean")
_CE = "llmk.cross_entropy"


def _reduce(loss_rows: Tensor, target: Tensor, ignore_index: int, reduction: str) -> Tensor:
    if reduction == "none":
        return loss_rows
    if reduction == "sum":
        return loss_rows.sum()
    return loss_rows.sum() / (target != ignore_index).sum()  # NaN when every row is ignored, as PyTorch


class _CrossEntropyGradInLogits(torch.autograd.Function):
    """logits [tokens, vocab] (not a leaf), target [tokens] -> the reduced loss ("mean" or "sum")
    and the rows' lse. The forward writes the gradient of the sum of the rows' losses over the
    logits (cross_entropy_grad_); the backward scales that buffer in place by the upstream
    gradient (over the count of rows not ignored, a device tensor, for "mean") and returns it, so
    it runs once per graph: a second backward raises."""

    @staticmethod
    def forward(ctx, logits, target, args, reduction):
        loss, lse = _cross_entropy_grad_(logits, target, *args)
        # The op writes logits below autograd: bump its version so that any backward that saved the
        # logits' values refuses to run on the gradient now in their place.
        torch.autograd.graph.increment_version(logits)
        ctx.save_for_backward(logits, target)
        ctx.mark_non_differentiable(lse)
        ctx.ignore_index, ctx.reduction, ctx.scaled = args[0], reduction, False
        return _reduce(loss, target, args[0], reduction), lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dloss, dlse):
        if ctx.scaled:
            raise RuntimeError(f"{_CE}: with grad_in_logits=True the backward scales the gradient that the forward "
                               "wrote over the logits in place, so it runs once per loss: a second backward through "
                               "it (retain_graph=True) needs grad_in_logits=False")
        ctx.scaled = True
        dlogits, target = ctx.saved_tensors
        if ctx.reduction == "mean":  # all rows ignored: a zero gradient, as the default path
            dloss = dloss / (target != ctx.ignore_index).sum().clamp(min=1)
        return dlogits.mul_(dloss), None, None, None


def _logits_to_overwrite(logits: Tensor) -> Tensor:
    """logits [..., vocab] as the [tokens, vocab] view that the gradient is written through, or an
    error (before anything is written) where the in-place form cannot be honoured."""
    if logits.is_leaf or (logits._base is not None and logits._base.is_leaf):
        raise RuntimeError(f"{_CE}: grad_in_logits=True writes the gradient over logits, which is a leaf tensor "
                           "that requires grad (or a view of one): torch forbids writing it in place; pass the "
                           "output of the op that computes the logits, or grad_in_logits=False")
    vocab = logits.shape[-1]
    if vocab > 1 and logits.stride(-1) != 1:
        raise ValueError(f"{_CE}: grad_in_logits=True needs logits contiguous in the vocab dimension (stride 1), "
                         f"got strides {logits.stride()}: pass logits.contiguous() or grad_in_logits=False")
    try:
        return logits.view(-1, vocab)
    except RuntimeError:
        raise ValueError(f"{_CE}: grad_in_logits=True needs logits' leading dimensions to flatten into rows of one "
                         f"stride (a view), got shape {tuple(logits.shape)} and strides {logits.stride()}: pass "
                         "logits.contiguous() or grad_in_logits=False") from None


@public
def cross_entropy(logits: Tensor, target: Tensor, ignore_index: int = -100, label_smoothing: float = 0.0,
                  reduction: str = "mean", z_loss: float = 0.0, return_lse: bool = False,
                  grad_in_logits: bool = False):
    """``torch.nn.functional.cross_entropy(logits, target, ignore_index=..., label_smoothing=...,
    reduction=...)`` over logits ``[..., vocab]`` (float32, float16, bfloat16; fp32 math) and
    int64/int32 targets ``[...]``, plus ``z_loss * lse**2`` per row (PaLM's z-loss); with
    autograd. The loss is float32 whatever the logits' dtype. ``reduction="mean"`` averages
    over the rows not ignored (NaN when all are, as PyTorch). With ``return_lse`` also returns
    the per-row float32 log-sum-exp. On the GPU a target out of range gives that row a NaN
    loss (checking would need a sync); on the CPU it raises.

    ``grad_in_logits=True`` (``reduction`` "mean" or "sum"; "none" is rejected) saves a pass over
    the logits and the gradient's buffer (Liger-Kernel's trick): when a gradient is needed (grad
    mode on and logits requiring grad) the forward writes the logits' gradient **over the logits**
    in the same pass, and the backward scales that buffer in place by the upstream gradient and
    returns it. **The logits' values are destroyed**: after the call their buffer holds the
    gradient of the sum of the rows' losses, and after the backward the gradient itself. So the
    logits must not be read afterwards (autograd raises where a backward saved them), cannot be
    a leaf (or a view of one), must be contiguous in the vocab dimension and flatten to
    ``[tokens, vocab]`` as a view; the backward runs once (a second one, with
    ``retain_graph=True``, raises). The gradient is rounded twice in float16/bfloat16 (written by
    the forward, then scaled) where the default path rounds once. Without a gradient to track it
    is the default path, the logits untouched."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{_CE}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if grad_in_logits and reduction == "none":
        raise ValueError(f"{_CE}: grad_in_logits=True needs reduction 'mean' or 'sum' (the gradient is written in "
                         "the forward with one scale for every row), got 'none'")
    args, rows = (ignore_index, label_smoothing, z_loss), target.reshape(-1)
    if grad_in_logits and torch.is_grad_enabled() and logits.requires_grad:
        loss, lse = _CrossEntropyGradInLogits.apply(_logits_to_overwrite(logits), rows, args, reduction)
    else:
        loss, lse = _cross_entropy(logits.reshape(-1, logits.shape[-1]), rows, *args)
        loss = _reduce(loss, rows, ignore_index, reduction)
    if reduction == "none":
        loss = loss.view(target.shape)
    return (loss, lse.view(target.shape)) if return_lse else loss


# --- fused linear + cross-entropy -------------------------------------------------------------
#
# A composition of the ops above, llmk.linear for the logits and, on the GPU, cuBLAS for the
# gradients' products written in place (no torch.ops.llmk op of its own): the tokens go through
# in chunks, so that one chunk of logits is in memory at a time. The algorithm, the memory and
# the reductions' paths are in fused_linear_cross_entropy's docstring and
# docs/kernels/cross_entropy.md.

_FLCE = "llmk.fused_linear_cross_entropy"
_MIN_CHUNK_LOGITS = 1 << 25  # the default chunk holds at least this many logits (64 MiB in bf16)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_ceil(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _pow2_floor(n: int) -> int:
    return 1 if n <= 1 else 1 << (n.bit_length() - 1)


def _flce_chunk_size(tokens: int, hidden: int, vocab: int, weight_grad: bool, accumulator_bytes: int = 2) -> int:
    """The default chunk (tokens per chunk):

    - Liger-Kernel's rule: ceil(tokens / ceil(vocab / hidden)) rounded up to a power of 2, so that
      one chunk of logits is about the size of the hidden states;
    - at least 2^25 / vocab tokens (a power of 2): a chunk of 32 Mi logits (64 MiB bf16), so that
      short inputs run in one or a few chunks rather than one token at a time;
    - when the weight's gradient is accumulated over the chunks (`accumulator_bytes` per element:
      2 for the sum in the weight's dtype, the default, 4 for the float32 accumulator), at least
      accumulator_bytes x hidden / 16 tokens (a power of 2: H / 8 and H / 4). Each chunk's dW
      product reads and writes the accumulator in its epilogue (2 x accumulator_bytes x V x H
      bytes) for 2 x chunk x V x H FLOPs, chunk / accumulator_bytes FLOPs per byte: H / 16 at this
      floor, 256 at H 4096, near a current GPU's tensor rate over its bandwidth, so that traffic
      mostly hides behind the multiply; and the chunk's logits (chunk x V x 2 bytes) are then an
      eighth of the accumulator, which is in memory anyway;
    - at most the token count."""
    chunk = _pow2_ceil(_cdiv(tokens, _cdiv(vocab, hidden)))
    chunk = max(chunk, _pow2_floor(_MIN_CHUNK_LOGITS // vocab))
    if weight_grad:
        chunk = max(chunk, _pow2_floor(accumulator_bytes * hidden // 16))
    return max(1, min(tokens, chunk))


def _gemm(a: Tensor, b: Tensor, bias: Optional[Tensor] = None, residual: Optional[Tensor] = None) -> Tensor:
    """``a · bᵀ + bias + residual`` (bias or residual, not both), rounded once to a's dtype:
    llmk.linear where its kernels take the operands (16-byte aligned rows), else torch (a
    vocabulary or hidden size that is not a multiple of 8 elements), as llmk.linear's own backward
    does. On the CPU torch runs in float32 and rounds once, as llmk's CPU reference does (torch's
    CPU float16 GEMM rounds its partial sums); on the GPU F.linear, or addmm for a residual
    (cuBLAS adds it in float32 before its one rounding)."""
    if _aligned(a) and _aligned(b):
        return linear(a, b, bias, residual, "none")
    if a.device.type == "cpu":
        out = F.linear(a.float(), b.float(), None if bias is None else bias.float())
        return (out if residual is None else out + residual.float()).to(a.dtype)
    return F.linear(a, b, bias) if residual is None else torch.addmm(residual, a, b.t())


def _product_into(out: Tensor, a: Tensor, b: Tensor):
    """``out = a · b`` (a [M, K], b [K, N]; out [M, N], rows of a larger buffer), rounded once.
    GPU: cuBLAS writes out in place (torch.mm(out=)). The registered llmk.linear allocates its
    output, which would then be copied in, and its Hopper kernel has M / 128 x N / 256 tiles and
    no split-K: dhidden's chunk of 512 rows x H 4096 (K = V = 128256) is 64 tiles, fewer than a
    large GPU's SMs, and a smaller chunk leaves more of them idle. CPU: llmk's reference GEMM
    (double sums), copied in."""
    if out.is_cuda:
        torch.mm(a, b, out=out)
    else:
        out.copy_(_gemm(a, b.t()))


class _WeightGrad:
    """The weight's gradient ``Σ_chunks dlogitsᵀ · hidden``, summed in place chunk by chunk (`add`),
    in one of two accumulators (`dtype`):

    - the weight's dtype (the default): the sum is the returned gradient. GPU: one cuBLAS GEMM per
      chunk with beta 1 into it (``dW.addmm_(dlogitsᵀ, hidden)``, as Liger-Kernel sums): its
      epilogue reads the running sum, adds it to the product in float32 and rounds the new sum
      once, in place. CPU: llmk's reference GEMM with the running sum as its residual (double,
      one rounding) into an output of one vocabulary slice, copied back: the same roundings.
    - float32: a float32 accumulator in vocabulary slices. GPU: cuBLAS adds each chunk's product
      to it in float32, in place (``addmm(out_dtype=float32, out=acc)``, torch >= 2.8), the
      product never rounded to the weight's dtype. CPU: the float32 product of the upcast
      operands. `result` rounds each slice to the weight's dtype and frees it in turn, so the
      float32 and the rounded copies are never both whole (at most 4 V H + V H / 2 bytes).

    Why cuBLAS on the GPU: the registered llmk.linear allocates its output, so the sum through it
    (the running sum as its residual) wrote a product slice and copied it back, 4 V H bytes more
    per chunk. llmk's C++ GEMM can write in place (residual = out) but no in-place op is
    registered; its Hopper kernel is not ahead of cuBLAS at these shapes, so that op would be for
    ownership, not speed."""

    def __init__(self, weight: Tensor, chunk: int, dtype: torch.dtype):
        vocab, hidden = weight.shape
        self.dtype, self.cuda = weight.dtype, weight.is_cuda
        self.whole = weight.new_zeros(weight.shape) if dtype == weight.dtype else None
        if self.whole is not None and self.cuda:
            self.slices = [(0, vocab)]  # in place: no product buffer to bound
        else:
            # About one chunk of logits per slice, at most a quarter of the vocabulary; multiples
            # of 8 rows: aligned slices.
            rows = max(8, min(chunk * vocab // hidden, _cdiv(vocab, 4)) // 8 * 8)
            rows = _cdiv(_cdiv(vocab, _cdiv(vocab, rows)), 8) * 8  # the same number of slices, balanced
            self.slices = [(v, min(v + rows, vocab)) for v in range(0, vocab, rows)]
        if self.whole is None:
            self.acc = [weight.new_zeros((v1 - v0, hidden), dtype=torch.float32) for v0, v1 in self.slices]
        else:
            self.acc = [self.whole[v0:v1] for v0, v1 in self.slices]

    def add(self, dlogits: Tensor, hidden: Tensor):
        for (v0, v1), acc in zip(self.slices, self.acc):
            g = dlogits[:, v0:v1].t()  # [slice, chunk]: a transposed view
            if self.cuda and self.whole is not None:
                acc.addmm_(g, hidden)
            elif self.cuda:
                torch.addmm(acc, g, hidden, out_dtype=torch.float32, out=acc)
            elif self.whole is not None:
                acc.copy_(_gemm(g, hidden.t(), residual=acc))
            else:
                acc.addmm_(g.float(), hidden.float())

    def result(self) -> Tensor:
        if self.whole is not None:
            return self.whole
        parts = []
        for i in range(len(self.acc)):
            parts.append(self.acc[i].to(self.dtype))
            self.acc[i] = None
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _flce_chunks(hidden, weight, bias, target, args, chunk, needs=(False, False, False), dloss=None, lse=None,
                 loss_out=None, lse_out=None, weight_grad_dtype=None, grad_in_logits=False):
    """One pass over the tokens (hidden [tokens, H], target [tokens]), `chunk` rows at a time:
    logits = hidden · weightᵀ + bias (llmk.linear), then one of

    - `grad_in_logits`: the rows' loss (into `loss_out`) and the gradient of the sum of the chunk's
      losses written over its logits in the same pass (cross_entropy_grad_, grad_scale 1): one
      chunk-sized buffer; the caller scales the sums below for its reduction (they are linear in
      the gradient);
    - `dloss` (the rows' upstream gradient, float32 [tokens]): the rows' loss and lse (or the given
      `lse`), then the logits' gradient into a second buffer (cross_entropy_backward);
    - neither: the rows' loss and lse (into `loss_out` / `lse_out`) only;

    and from the gradient the sums that `needs` = (hidden, weight, bias) asks for: dhidden rows =
    dlogits · weight (_product_into), dweight += dlogitsᵀ · hidden (_WeightGrad in
    `weight_grad_dtype`; one chunk: the product itself), dbias += the column sums of dlogits
    (float32). Returns (dhidden, dweight, dbias), None where not asked for."""
    tokens, vocab = hidden.shape[0], weight.shape[0]
    need_h, need_w, need_b = needs
    dh = torch.empty_like(hidden) if need_h else None
    db = hidden.new_zeros(vocab, dtype=torch.float32) if need_b else None
    acc = _WeightGrad(weight, chunk, weight_grad_dtype) if need_w and tokens > chunk else None
    dw = None
    for start in range(0, tokens, chunk):
        end = min(start + chunk, tokens)
        h, t = hidden[start:end], target[start:end]
        logits = _gemm(h, weight, bias)
        dlogits = None
        if grad_in_logits:
            loss_out[start:end] = _cross_entropy_grad_(logits, t, *args)[0]
            dlogits = logits
        else:
            if lse is None:
                loss_c, lse_c = _cross_entropy(logits, t, *args)
                if loss_out is not None:
                    loss_out[start:end] = loss_c
                if lse_out is not None:
                    lse_out[start:end] = lse_c
            else:
                lse_c = lse[start:end]
            if dloss is not None:
                dlogits = cross_entropy_backward(dloss[start:end], logits, t, lse_c, *args)
        del logits  # (as dlogits, the buffer lives on where the gradient was written over it)
        if dlogits is None:
            continue
        if need_h:
            _product_into(dh[start:end], dlogits, weight)
        if acc is not None:
            acc.add(dlogits, h)
        elif need_w:
            dw = _gemm(dlogits.t(), h.t())
        if need_b:
            db += dlogits.sum(0, dtype=torch.float32)
        del dlogits  # before the next chunk's logits are allocated
    if need_w:
        dw = acc.result() if acc is not None else dw if dw is not None else torch.zeros_like(weight)
    return dh, dw, db.to(bias.dtype) if db is not None else None


def _grad_in_logits(dtype: torch.dtype, reduction: str) -> bool:
    """Whether the forward of "mean" / "sum" writes each chunk's gradient over its logits (one
    chunk buffer; the gradient of the summed losses, the mean's 1 / count applied with the
    upstream gradient in the backward) rather than into a buffer of its own with 1 / count in the
    kernel: everywhere but float16 "mean", whose unscaled sums (dweight's up to tokens x max|h|)
    can pass float16's 65504 where the mean's gradient does not. bfloat16 has float32's range."""
    return reduction == "sum" or dtype != torch.float16


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """hidden [tokens, H], weight [V, H], target [tokens], bias [V] or None -> the loss (float32,
    reduced, or [tokens] for "none").

    "mean" / "sum": the forward computes the gradients too (the upstream gradient of a reduced
    loss is one scalar), those of the summed losses where _grad_in_logits; the backward
    multiplies them by one float32 factor (the upstream gradient, over the count of rows not
    ignored for "mean" in that case): in place with the sum in the weight's dtype (`in_place`,
    the default: no second [V, H] in memory while the backward runs; a second backward is
    refused), into new tensors with the float32 accumulator (a second backward with
    retain_graph scales the saved ones again).
    "none": the forward computes the loss rows and their lse (saved, 4 bytes a token); the
    backward recomputes the logits chunk by chunk with the per-row upstream gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, target, bias, args, reduction, chunk, weight_grad_dtype):
        ctx.needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[3])
        ctx.args, ctx.reduction, ctx.chunk, ctx.weight_grad_dtype = args, reduction, chunk, weight_grad_dtype
        ctx.in_place = weight_grad_dtype != torch.float32
        ctx.scaled, ctx.scale = False, None
        loss = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
        if reduction == "none":
            lse = torch.empty_like(loss)
            _flce_chunks(hidden, weight, bias, target, args, chunk, loss_out=loss, lse_out=lse)
            ctx.save_for_backward(hidden, weight, bias, target, lse)
            return loss
        count = (target != args[0]).sum() if reduction == "mean" else None  # on the device: no sync
        # 1 / (rows not ignored in the whole batch); every row ignored: 1, the gradients being zero
        scale = None if count is None else torch.reciprocal(count.clamp(min=1).to(torch.float32))
        if _grad_in_logits(hidden.dtype, reduction):
            grads = _flce_chunks(hidden, weight, bias, target, args, chunk, ctx.needs, loss_out=loss,
                                 weight_grad_dtype=weight_grad_dtype, grad_in_logits=True)
            ctx.scale = scale
        else:  # the rows' scale (1 / count, or 1) in the gradient's kernel, into a buffer of its own
            per_row = scale if scale is not None else hidden.new_ones((), dtype=torch.float32)
            grads = _flce_chunks(hidden, weight, bias, target, args, chunk, ctx.needs,
                                 dloss=per_row.expand(hidden.shape[0]), loss_out=loss,
                                 weight_grad_dtype=weight_grad_dtype)
        ctx.save_for_backward(*grads)
        return loss.sum() / count if reduction == "mean" else loss.sum()  # mean: NaN when every row is ignored

    @staticmethod
    @once_differentiable
    def backward(ctx, dloss):
        if ctx.reduction == "none":
            hidden, weight, bias, target, lse = ctx.saved_tensors
            dh, dw, db = _flce_chunks(hidden, weight, bias, target, ctx.args, ctx.chunk, ctx.needs,
                                      dloss=dloss.to(torch.float32), lse=lse, weight_grad_dtype=ctx.weight_grad_dtype)
            return dh, dw, None, db, None, None, None, None
        # Shape [1], not 0-dim: torch casts a 0-dim CUDA operand to the gradient's dtype before it
        # multiplies (a factor of 1/3 would be 2^-9 off in bf16, every element with it); a [1] one
        # takes part in the float32 math, and the product is rounded once.
        factor = dloss.to(torch.float32) if ctx.scale is None else dloss.to(torch.float32) * ctx.scale
        factor = factor.reshape(1)
        if ctx.in_place:
            if ctx.scaled:
                raise RuntimeError(f"{_FLCE}: with the weight's gradient summed in its dtype ({ctx.weight_grad_dtype}, "
                                   "the default) the backward scales the gradients saved by the forward in place, so "
                                   "it runs once per loss: a second backward through it (retain_graph=True) needs "
                                   "weight_grad_dtype=torch.float32")
            ctx.scaled = True
            dh, dw, db = (g if g is None else g.mul_(factor) for g in ctx.saved_tensors)
        else:
            dh, dw, db = (g if g is None else torch.mul(g, factor, out=torch.empty_like(g)) for g in ctx.saved_tensors)
        return dh, dw, None, db, None, None, None, None


@public
def fused_linear_cross_entropy(hidden: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor] = None,
                               ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean",
                               z_loss: float = 0.0, chunk_size: Optional[int] = None,
                               weight_grad_dtype: Optional[torch.dtype] = None) -> Tensor:
    """``cross_entropy(linear(hidden, weight, bias), target, ...)`` (an LM head and its loss) without
    the ``[tokens, vocab]`` logits in memory: the tokens go through in chunks of ``chunk_size`` rows
    (llmk.linear for the logits, llmk's cross-entropy kernels for the loss and the logits'
    gradient, then the gradients' products), so one chunk of logits is in memory at a time.
    Arguments and result as :func:`llmk.cross_entropy` (the loss is float32; ``reduction="mean"``
    averages over the rows not ignored in the whole batch, NaN when all are ignored, as PyTorch,
    their gradients then zero; ``z_loss * lse**2`` per row).

    hidden ``[..., H]`` and weight ``[V, H]`` (nn.Linear's layout; bias ``[V]``) are float16 or
    bfloat16, the same dtype (float32 is rejected, as by llmk.linear); target ``[...]`` (hidden's
    leading shape) int64 or int32. Rows are 16-byte aligned for llmk's GEMM kernels when H and V
    are multiples of 8; other sizes send the logits' product to torch's F.linear.

    Gradients (hidden, weight, bias) are computed during the forward for ``reduction="mean"`` and
    ``"sum"`` (Liger-Kernel's approach: the backward only multiplies them by the upstream
    gradient). Per chunk the loss kernel writes the gradient of the chunk's summed losses over
    the chunk's logits in the same pass (one chunk-sized buffer; for float16 "mean", whose
    unscaled sums could overflow, the gradient with 1 / count goes to a buffer of its own), then
    ``dhidden rows = dlogits · weight``, ``dweight += dlogitsᵀ · hidden`` (summed in
    ``weight_grad_dtype``, below) and ``dbias +=`` the column sums of dlogits; on the GPU the
    gradients' products are cuBLAS GEMMs writing in place (no product buffers or copies). The
    backward multiplies them by the upstream gradient (and 1 / count for "mean") in float32,
    rounding once. ``reduction="none"`` computes the loss rows in the forward (saving their lse,
    4 bytes a token) and the gradients in the backward, which recomputes the logits chunk by
    chunk with the per-row upstream gradient (the logits and their gradient, two chunk buffers).
    Without a gradient to track (torch.no_grad, or no input requiring one) only the loss is
    computed.

    ``weight_grad_dtype``: what the weight's gradient is summed in over the chunks.

    - ``None`` (the default) or the weight's dtype: the sum is the returned gradient itself: each
      chunk's product is added to the running sum in float32 and the new sum rounded once, in
      place (as Liger-Kernel sums by default). No accumulator beyond the gradient, and the
      backward of "mean" / "sum" scales the saved gradients in place (no second [V, H] while it
      runs), so it runs once per loss: a second backward (``retain_graph=True``) raises. Rounding
      error: at most u Σ_c |S_c| (u the dtype's unit roundoff, 2^-8 bf16, 2^-11 fp16; S_c the sum
      after chunk c, the last one dweight): up to n u |dweight| over n chunks where the products
      agree in sign, about sqrt(n) u |dweight| where their roundings are independent (at an LM
      head's sizes close to the float32 accumulator's error). A smaller ``chunk_size`` means more
      chunks, more roundings.
    - ``torch.float32``: a float32 accumulator, 4 x V x H bytes (2.0 GiB at V 128256, H 4096)
      beyond the gradient, rounded to the weight's dtype once at the end (the products are added
      unrounded): the unfused GEMM's one rounding. A second backward is allowed.

    Other dtypes are rejected. With a single chunk both give the same gradients (there is no sum).

    ``chunk_size`` (rows per chunk): by default Liger's ceil(tokens / ceil(V / H)) rounded up to a
    power of 2 (a chunk of logits about the size of hidden), at least 2^25 / V rows (a power of 2;
    32 Mi logits), and when the weight's gradient is accumulated at least H / 8 rows with the sum
    in the weight's dtype and H / 4 with float32 (a power of 2: each chunk's product reads and
    writes the accumulator, which then hides behind its multiply; the chunk's logits are an eighth
    of the accumulator). Memory beyond the inputs and the returned gradients: one chunk of logits
    (chunk x V in the dtype; two for "none"'s backward and float16 "mean"), the per-token float32
    loss, and the float32 accumulator where asked for (when the weight's gradient spans several
    chunks). torch.compile traces it (the chunk loop unrolled) but the tests do not cover it."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{_FLCE}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if hidden.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"{_FLCE}: hidden is {str(hidden.dtype).replace('torch.', '')}; the GEMMs take float16 or "
                        "bfloat16 (as llmk.linear): cast hidden and weight")
    if hidden.dim() < 1 or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"{_FLCE}: hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)} do not make a "
                         "linear layer (hidden [..., H], weight [V, H])")
    if weight.dtype != hidden.dtype or (bias is not None and bias.dtype != hidden.dtype):
        raise TypeError(f"{_FLCE}: weight ({weight.dtype}) and bias ({None if bias is None else bias.dtype}) must "
                        f"have hidden's dtype ({hidden.dtype})")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"{_FLCE}: bias has shape {tuple(bias.shape)}, expected ({weight.shape[0]},)")
    if tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"{_FLCE}: target has shape {tuple(target.shape)}, expected hidden's leading shape "
                         f"{tuple(hidden.shape[:-1])}")
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{_FLCE}: target is {target.dtype}, expected int64 or int32")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"{_FLCE}: chunk_size must be a positive int or None, got {chunk_size!r}")
    accumulator = weight.dtype if weight_grad_dtype is None else weight_grad_dtype
    if accumulator not in (weight.dtype, torch.float32):
        raise ValueError(f"{_FLCE}: weight_grad_dtype must be None or the weight's dtype ({weight.dtype}: the "
                         f"gradient itself, the default) or torch.float32 (a float32 accumulator), got "
                         f"{weight_grad_dtype!r}")
    h2 = hidden.reshape(-1, hidden.shape[-1])
    if h2.stride(-1) != 1:
        h2 = h2.contiguous()
    t1 = target.reshape(-1)
    tokens, (vocab, size) = h2.shape[0], weight.shape
    args = (ignore_index, label_smoothing, z_loss)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    chunk = chunk_size or _flce_chunk_size(tokens, size, vocab, grad and weight.requires_grad,
                                           torch.finfo(accumulator).bits // 8)
    if grad:
        loss = _FusedLinearCrossEntropy.apply(h2, weight, t1, bias, args, reduction, chunk, accumulator)
    else:
        rows = h2.new_empty(tokens, dtype=torch.float32)
        _flce_chunks(h2, weight, bias, t1, args, chunk, loss_out=rows)
        loss = _reduce(rows, t1, ignore_index, reduction)
    return loss.view(target.shape) if reduction == "none" else loss
