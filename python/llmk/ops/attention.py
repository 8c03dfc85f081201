"""Attention forward (FlashAttention 2's algorithm; the backward is a later issue): attention,
attention_varlen, and scaled_dot_product_attention in PyTorch's convention.
C++ kernels: python/src/ops_attention.cc over include/llmk/attention.h."""

from typing import Optional

import torch
from torch import Tensor

from ._table import define, like, public


def _lse(q: Tensor, want: bool) -> Tensor:
    """The fake of the float32 lse output: [batch, heads, seq_q] of q [batch, seq_q, heads, dim]
    (varlen q [total, heads, dim]: [heads, total]); empty when not wanted."""
    shape = (q.shape[1], q.shape[0]) if q.dim() == 3 else (q.shape[0], q.shape[2], q.shape[1])
    return q.new_empty(shape if want else (0,), dtype=torch.float32)


def _no_setup(ctx, inputs, output):
    pass


def _no_backward(ctx, *grads):
    raise NotImplementedError(
        "llmk attention: the backward pass is not implemented yet (forward only); for training use "
        "torch.nn.functional.scaled_dot_product_attention")


_attention = define(
    "attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None, bool return_lse=False) "
    "-> (Tensor, Tensor)",
    lambda q, k, v, causal, scale, return_lse: (like(q), _lse(q, return_lse)),
    setup=_no_setup, backward=_no_backward, public=False)

_attention_varlen = define(
    "attention_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
    "int max_seqlen_k, bool causal=False, float? scale=None, bool return_lse=False) -> (Tensor, Tensor)",
    lambda q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, return_lse: (like(q), _lse(q, return_lse)),
    setup=_no_setup, backward=_no_backward, public=False)


@public
def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale: Optional[float] = None,
              return_lse: bool = False):
    """softmax(scale * q k^T) v over ``[batch, seq, heads, head_dim]`` q and k/v (FlashAttention's
    layout; heads_q a multiple of heads_kv for GQA/MQA), fp16 or bf16, head_dim 32/64/96/128/256.
    ``causal`` aligns the mask to the bottom-right corner when seq_q != seq_k (FlashAttention 2);
    rows that see no key give 0 (lse -inf). ``scale`` defaults to 1/sqrt(head_dim). Returns out,
    or ``(out, lse)`` with lse float32 ``[batch, heads_q, seq_q]``. Forward only."""
    out, lse = _attention(q, k, v, causal, scale, return_lse)
    return (out, lse) if return_lse else out


@public
def attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                     max_seqlen_k: int, causal: bool = False, scale: Optional[float] = None,
                     return_lse: bool = False):
    """:func:`attention` over packed variable-length sequences (FlashAttention's varlen API):
    q ``[total_q, heads_q, head_dim]``, k/v ``[total_k, heads_kv, head_dim]``, int32 prefix sums
    ``cu_seqlens_q``/``cu_seqlens_k`` of ``batch + 1`` entries, and the longest lengths. On the GPU
    the cu_seqlens are the caller's contract (start at 0, non-decreasing, end at the totals,
    within the max lengths); the CPU backend checks them. lse is ``[heads_q, total_q]``."""
    out, lse = _attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                                 return_lse)
    return (out, lse) if return_lse else out


@public
def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` on ``[batch, heads, seq, head_dim]``
    tensors, through :func:`attention` (no copies: the layouts are transposed views). Supports
    what the llmk kernel computes: no attn_mask, no dropout, is_causal with seq_q == seq_k
    (PyTorch aligns a causal mask top-left, llmk bottom-right; they agree only then)."""
    if attn_mask is not None:
        raise ValueError("llmk.scaled_dot_product_attention: attn_mask is not supported (use is_causal)")
    if dropout_p != 0.0:
        raise ValueError("llmk.scaled_dot_product_attention: dropout_p must be 0 (forward inference kernel)")
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
