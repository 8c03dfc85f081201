"""Decode attention over a KV cache: attention_decode (a decode step, or the verification of a
few speculative tokens, against each sequence's cached keys; optionally appending the new
tokens' k/v to the cache and rotating q and k with RoPE in the same launch). Inference only.
C++ kernels: python/src/ops_decode.cc over include/llmk/attention_decode.h (its header comment
documents the layouts and the caller's contract on the GPU)."""

from typing import Optional

import torch
from torch import Tensor

from ._table import define, like, public, wants_grad


def _fake(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, rotary_cos_sin, rotary_interleaved, causal,
          scale, return_lse, k_scale, v_scale, window=None, softcap=None, sinks=None):
    """out like q; lse float32 [batch, heads_q, q_len] of q [batch, q_len, heads_q, head_dim] (empty when not
    wanted). The caches are written in place (append), which the schema's (a!) / (b!) declare."""
    shape = (q.shape[0], q.shape[2], q.shape[1]) if return_lse else (0,)
    return like(q), q.new_empty(shape, dtype=torch.float32)


# k_cache and v_cache are mutable: with k_new / v_new the call writes them.
_attention_decode = define(
    "attention_decode(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cache_seqlens, "
    "Tensor? block_table=None, Tensor? k_new=None, Tensor? v_new=None, Tensor? rotary_cos_sin=None, "
    "bool rotary_interleaved=False, bool causal=True, float? scale=None, bool return_lse=False, "
    "Tensor? k_scale=None, Tensor? v_scale=None, int? window=None, float? softcap=None, Tensor? sinks=None) "
    "-> (Tensor, Tensor)",
    _fake, public=False)


@public
def attention_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
                     block_table: Optional[Tensor] = None, k_new: Optional[Tensor] = None,
                     v_new: Optional[Tensor] = None, rotary_cos_sin: Optional[Tensor] = None,
                     rotary_interleaved: bool = False, causal: bool = True, scale: Optional[float] = None,
                     return_lse: bool = False, k_scale: Optional[Tensor] = None, v_scale: Optional[Tensor] = None,
                     window: Optional[int] = None, softcap: Optional[float] = None, sinks: Optional[Tensor] = None):
    """Attention of a few new query tokens per sequence against a KV cache (FlashAttention's
    ``flash_attn_with_kvcache``, FlashInfer's paged decode), inference only.

    - q ``[batch, q_len, heads_q, head_dim]``, fp16 or bf16, head_dim one of
      ``llmk.attention_head_dims(decode=True)``, q_len >= 1 (1 for a decode step, up to 16 for
      speculative-decoding verification; longer q_len is exact, each further tile of query rows
      re-reading the keys).
    - k_cache / v_cache: contiguous ``[batch, max_len, heads_kv, head_dim]``, or paged
      ``[num_pages, page_size, heads_kv, head_dim]`` with ``block_table`` int32 ``[batch, max_pages]``
      (token t of sequence b in page ``block_table[b, t // page_size]``, row ``t % page_size``; any
      page order). In q's dtype, or ``torch.float8_e4m3fn`` with float32 ``k_scale`` / ``v_scale``
      ``[heads_kv]`` (a stored x means x * scale). heads_q a multiple of heads_kv (GQA/MQA).
    - cache_seqlens int32 ``[batch]``: the tokens already in each sequence's cache (0 allowed:
      out 0, lse -inf). Without k_new the q tokens are the last q_len of them.
    - k_new / v_new ``[batch, q_len, heads_kv, head_dim]`` (q's dtype): written into the caches
      at positions ``cache_seqlens + i`` (quantized as x / scale for fp8) before attending over
      ``cache_seqlens + q_len`` keys. With ``rotary_cos_sin`` (float32 ``[max_pos, rot_dim]``,
      cos then sin, as :func:`rope_`'s cache) q and k_new are rotated first at those positions
      (NeoX pairs, or GPT-J's with ``rotary_interleaved``); q itself is not modified.
      cache_seqlens is not updated: add q_len after the call.
    - causal: query i sees key j iff j <= i + seqlen_k - q_len (bottom-right); scale defaults to
      1/sqrt(head_dim).
    - window / softcap / sinks: the score variants of :func:`attention` over the cache (the window
      counts back from each query's own position).

    Returns out (like q) or ``(out, lse)`` with lse float32 ``[batch, heads_q, q_len]`` (natural
    log). On the GPU the lengths and page ids are the caller's contract (cache_seqlens (+ q_len)
    within the cache's capacity, the pages a sequence uses within the cache; a broken one is
    clamped, never read or written outside the tensors); the CPU backend checks them and raises.
    No host synchronization and no allocation but through torch's allocator: a call captures in
    a CUDA graph and replays with new cache_seqlens."""
    if not torch.compiler.is_compiling() and wants_grad(q, k_cache, v_cache, k_new, v_new):
        raise RuntimeError("llmk.attention_decode is an inference op (no backward): call it under torch.no_grad() "
                           "or torch.inference_mode(), or pass tensors that do not require grad")
    out, lse = _attention_decode(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, rotary_cos_sin,
                                 rotary_interleaved, causal, scale, return_lse, k_scale, v_scale, window, softcap,
                                 sinks)
    return (out, lse) if return_lse else out
