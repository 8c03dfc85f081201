"""Attention (FlashAttention 2's algorithm), forward and backward: attention, attention_varlen,
and scaled_dot_product_attention in PyTorch's convention, with autograd through
attention_backward / attention_varlen_backward (the forward saves out and lse).
C++ kernels: python/src/ops_attention.cc over include/llmk/attention.h."""

from typing import Optional

import torch
from torch import Tensor

from ._table import define, like, public, wants_grad


def _lse(q: Tensor, want: bool) -> Tensor:
    """The fake of the float32 lse output: [batch, heads, seq_q] of q [batch, seq_q, heads, dim]
    (varlen q [total, heads, dim]: [heads, total]); empty when not wanted."""
    shape = (q.shape[1], q.shape[0]) if q.dim() == 3 else (q.shape[0], q.shape[2], q.shape[1])
    return q.new_empty(shape if want else (0,), dtype=torch.float32)


def _gradients(dout, q, k, v, *unused):
    """The fake of a backward's (dq, dk, dv): contiguous, like q, k and v."""
    return like(q), like(k), like(v)


def _setup(ctx, inputs, output, extra=()):
    """Saves what the backward needs: q, k, v, out and lse (None when the call did not compute it:
    a direct torch.ops.llmk call with return_lse=False; the public functions always ask for it
    when a gradient is needed), the sinks, causal, scale, deterministic (or torch's deterministic
    mode), window and softcap."""
    q, k, v = inputs[:3]
    causal, scale, return_lse, deterministic, window, softcap, sinks = inputs[-7:]
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse if return_lse else None, sinks, *extra)
    ctx.causal, ctx.scale, ctx.window, ctx.softcap = causal, scale, window, softcap
    ctx.deterministic = deterministic or torch.are_deterministic_algorithms_enabled()


def _dsinks(ctx, sinks, dout, out, lse):
    """The sinks' gradient: -sum over a head's rows of exp(sink - lse) * rowsum(dout * out) (the
    sink's probability times the D that every probability's gradient subtracts), in float32.
    lse is [batch, heads, seq] (varlen [heads, total]); out and dout [..., heads, dim]."""
    if sinks is None or not ctx.needs_input_grad[-1]:
        return None
    d = (dout.float() * out.float()).sum(-1)  # [batch, seq, heads] or [total, heads]
    d = d.transpose(1, 2) if d.dim() == 3 else d.t()
    s = sinks.float().view(-1, 1) if lse.dim() == 2 else sinks.float().view(1, -1, 1)
    p = torch.where(torch.isinf(lse), torch.zeros_like(lse), torch.exp(s - lse))
    dims = (1,) if lse.dim() == 2 else (0, 2)
    return (-(p * d).sum(dims)).to(sinks.dtype)


def _attention_setup(ctx, inputs, output):
    _setup(ctx, inputs, output)


def _attention_grad(ctx, dout, unused_dlse):  # lse is a statistic: not differentiable
    q, k, v, out, lse, sinks = ctx.saved_tensors
    variants = (ctx.window, ctx.softcap, sinks)
    if lse is None:
        lse = _attention(q, k, v, ctx.causal, ctx.scale, True, False, *variants)[1]
    dq, dk, dv = attention_backward(dout, q, k, v, out, lse, ctx.causal, ctx.scale, ctx.deterministic, *variants)
    return dq, dk, dv, None, None, None, None, None, None, _dsinks(ctx, sinks, dout, out, lse)


def _attention_varlen_setup(ctx, inputs, output):
    ctx.max_seqlen = inputs[5:7]
    _setup(ctx, inputs, output, extra=inputs[3:5])


def _attention_varlen_grad(ctx, dout, unused_dlse):
    q, k, v, out, lse, sinks, cu_q, cu_k = ctx.saved_tensors
    max_q, max_k = ctx.max_seqlen
    variants = (ctx.window, ctx.softcap, sinks)
    if lse is None:
        lse = _attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, ctx.causal, ctx.scale, True, False, *variants)[1]
    dq, dk, dv = attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, ctx.causal, ctx.scale,
                                           ctx.deterministic, *variants)
    return (dq, dk, dv, None, None, None, None, None, None, None, None, None, None,
            _dsinks(ctx, sinks, dout, out, lse))


_VARIANTS = "int? window=None, float? softcap=None, Tensor? sinks=None"

_attention = define(
    "attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None, bool return_lse=False, "
    f"bool deterministic=False, {_VARIANTS}) -> (Tensor, Tensor)",
    lambda q, k, v, causal, scale, return_lse, deterministic, *variants: (like(q), _lse(q, return_lse)),
    setup=_attention_setup, backward=_attention_grad, public=False)

_attention_varlen = define(
    "attention_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
    f"int max_seqlen_k, bool causal=False, float? scale=None, bool return_lse=False, bool deterministic=False, "
    f"{_VARIANTS}) -> (Tensor, Tensor)",
    lambda q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, return_lse, deterministic, *variants:
        (like(q), _lse(q, return_lse)),
    setup=_attention_varlen_setup, backward=_attention_varlen_grad, public=False)

attention_backward = define(
    "attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal=False, "
    f"float? scale=None, bool deterministic=False, {_VARIANTS}) -> (Tensor, Tensor, Tensor)",
    _gradients,
    doc="Gradients ``(dq, dk, dv)`` of :func:`attention` for the upstream gradient ``dout``, from the forward's "
        "q, k, v, out and float32 lse ``[batch, heads_q, seq_q]`` (``return_lse=True``), causal and scale. dk and dv "
        "sum each kv head's query group (GQA). Rows whose lse is -inf (they see no key) get dq = 0 and add nothing. "
        "``deterministic``: bitwise-identical results run to run (on Hopper the key blocks add dq in a fixed order, on "
        "the sm_80 path dq comes from its own kernel instead of fp32 atomics; slower). On Hopper the head dims of the "
        "TMA + wgmma kernels (``llmk info`` lists them) run those, the rest the sm_80 one (LLMK_ATTENTION_PATH forces "
        "one, as for the forward). window, softcap and sinks must be the forward's (the sinks' gradient comes from "
        "autograd through :func:`attention`, not from this op).")

attention_varlen_backward = define(
    "attention_varlen_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
    "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, bool causal=False, "
    f"float? scale=None, bool deterministic=False, {_VARIANTS}) -> (Tensor, Tensor, Tensor)",
    _gradients,
    doc="Gradients ``(dq, dk, dv)`` of :func:`attention_varlen` (packed sequences; lse ``[heads_q, total_q]``), as "
        ":func:`attention_backward`.")


@public
def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale: Optional[float] = None,
              return_lse: bool = False, deterministic: bool = False, window: Optional[int] = None,
              softcap: Optional[float] = None, sinks: Optional[Tensor] = None):
    """softmax(scale * q k^T) v over ``[batch, seq, heads, head_dim]`` q and k/v (FlashAttention's
    layout; heads_q a multiple of heads_kv for GQA/MQA), fp16 or bf16, head_dim one of
    :func:`llmk.attention_head_dims` (``compiled=False``: all of them on the CPU).
    ``causal`` aligns the mask to the bottom-right corner when seq_q != seq_k (FlashAttention 2);
    rows that see no key give 0 (lse -inf). ``scale`` defaults to 1/sqrt(head_dim). Returns out,
    or ``(out, lse)`` with lse float32 ``[batch, heads_q, seq_q]`` (not differentiable).
    Differentiable in q, k and v (:func:`attention_backward`; the forward then also computes lse,
    which the backward reads). ``deterministic`` (or ``torch.use_deterministic_algorithms(True)``)
    makes the gradients bitwise identical run to run, at the cost of a slower dq pass; the
    default sums dq with fp32 atomics.

    The score variants (each off when None; on the GPU the Hopper forward and backward take them,
    the sm_80 kernels reject them with an error naming them): ``window`` (int >= 1,
    causal only):
    row i, at key position i' = i + seq_k - seq_q, sees the keys j with i' - window < j <= i'
    (Mistral's and Gemma's sliding window); ``softcap`` (float > 0): each score s = scale * q.k
    becomes softcap * tanh(s / softcap) (Gemma 2); ``sinks`` (float32 ``[heads_q]``,
    differentiable): a logit per query head that joins every row's softmax denominator without a
    value (gpt-oss), so lse includes it and a row without keys gives 0 with lse = sink."""
    out, lse = _attention(q, k, v, causal, scale, return_lse or wants_grad(q, k, v, sinks), deterministic, window,
                          softcap, sinks)
    return (out, lse) if return_lse else out


@public
def attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                     max_seqlen_k: int, causal: bool = False, scale: Optional[float] = None,
                     return_lse: bool = False, deterministic: bool = False, window: Optional[int] = None,
                     softcap: Optional[float] = None, sinks: Optional[Tensor] = None):
    """:func:`attention` over packed variable-length sequences (FlashAttention's varlen API):
    q ``[total_q, heads_q, head_dim]``, k/v ``[total_k, heads_kv, head_dim]``, int32 prefix sums
    ``cu_seqlens_q``/``cu_seqlens_k`` of ``batch + 1`` entries, and the longest lengths. On the GPU
    the cu_seqlens are the caller's contract (start at 0, non-decreasing, end at the totals,
    within the max lengths); the CPU backend checks them. lse is ``[heads_q, total_q]``.
    Differentiable in q, k, v (and sinks), ``deterministic`` and the score variants as
    :func:`attention`'s."""
    out, lse = _attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                                 return_lse or wants_grad(q, k, v, sinks), deterministic, window, softcap, sinks)
    return (out, lse) if return_lse else out


@public
def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` on ``[batch, heads, seq, head_dim]``
    tensors, through :func:`attention` (no copies: the layouts are transposed views), with its
    gradients (deterministic under ``torch.use_deterministic_algorithms(True)``). Supports
    what the llmk kernel computes: no attn_mask, no dropout, is_causal with seq_q == seq_k
    (PyTorch aligns a causal mask top-left, llmk bottom-right; they agree only then)."""
    if attn_mask is not None:
        raise ValueError("llmk.scaled_dot_product_attention: attn_mask is not supported (use is_causal)")
    if dropout_p != 0.0:
        raise ValueError("llmk.scaled_dot_product_attention: dropout_p must be 0 (the kernel has no dropout)")
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError("llmk.scaled_dot_product_attention: query, key and value must be [batch, heads, seq, head_dim]")
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError(f"llmk.scaled_dot_product_attention: {query.shape[1]} query heads and {key.shape[1]} key "
                         "heads need enable_gqa=True")
    if is_causal and query.shape[2] != key.shape[2]:
        raise ValueError("llmk.scaled_dot_product_attention: is_causal with seq_q != seq_k is aligned top-left by "
                         "PyTorch and bottom-right by llmk; call llmk.attention(causal=True) for the latter")
    out = attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=is_causal, scale=scale)
    return out.transpose(1, 2)
