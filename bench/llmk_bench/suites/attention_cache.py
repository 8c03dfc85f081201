"""Benchmark cases of attention over a KV cache with many query tokens (issue 57's prefill over a
paged cache: chunked prefill, prefix caching): a chunk of `tokens` new query tokens of one
sequence whose cache holds `hidden` earlier tokens plus the chunk's own (written before the call),
causal bottom-right, GQA 32 query / 8 kv heads, head dim 128, bf16.

Op ``attention_paged_prefill``; impls: ``llmk`` (llmk.attention_decode over the cache in pages of
16 tokens, the pages in a random order: from 64 query tokens it runs the Hopper prefill kernel
over the cache), ``llmk_page128`` (pages of 128 tokens, a key block each), ``llmk_contiguous``
(the same call over a contiguous cache), ``llmk_dense``
(llmk.attention over dense K/V of the same keys: the prefill kernel's own speed, the yardstick
the paged call must hold), ``llmk_decode_kernel`` (the paged call forced onto the decode kernel,
LLMK_DECODE_PATH=decode: what such a call ran before, chunks up to 4096 tokens), ``cudnn`` and
``flash`` (SDPA's backends on dense K/V, where the chunk is the whole sequence: their causal mask
aligns top-left, which is the same mask only without a prefix).
Points (tokens x hidden): 2048 x 0, 2048 x 6144, 4096 x 12288, 16384 x 0, 16384 x 16384.

FLOPs: 4 * 128 per visible (query, key) pair per query head: chunk x prefix + chunk (chunk + 1) / 2.
Bytes: K and V of the keys read once, q and out. max_rel_err: the last 256 query rows of head 0
against float64. Without a GPU: the CPU backend at small shapes, llmk and llmk_dense."""

import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import llmk

HEADS_Q, HEADS_KV, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16
CHECK_ROWS = 256
PEERS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
POINTS = {"attention_paged_prefill": [(2048, 0), (2048, 6144), (4096, 12288), (16384, 0), (16384, 16384)]}
BIG_PAGE = 128
Q, K_PAGED, V_PAGED, TABLE, LENS, K, V, K_T, V_T, K_BIG, V_BIG, TABLE_BIG = range(12)


def _decode_kernel(*s):
    """The paged call on the decode kernel (the path is read when the call runs, or is captured)."""
    before = os.environ.get("LLMK_DECODE_PATH")
    os.environ["LLMK_DECODE_PATH"] = "decode"
    try:
        return llmk.attention_decode(s[Q], s[K_PAGED], s[V_PAGED], s[LENS], s[TABLE], causal=True)
    finally:
        if before is None:
            del os.environ["LLMK_DECODE_PATH"]
        else:
            os.environ["LLMK_DECODE_PATH"] = before


def _sdpa(backend):
    def run(*s):
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(s[Q].transpose(1, 2), s[K_T], s[V_T], is_causal=True,
                                                 enable_gqa=True)
        return out.transpose(1, 2)
    return run


def prefill_case(chunk, prefix, dtype, device):
    n = prefix + chunk
    elt = torch.tensor([], dtype=dtype).element_size()
    bytes_moved = (2 * n * HEADS_KV + 2 * chunk * HEADS_Q) * HEAD_DIM * elt
    flops = 4 * HEADS_Q * HEAD_DIM * (chunk * prefix + chunk * (chunk + 1) // 2)

    def paged(k, v, page_size):
        """k and v [1, n, heads, dim] in pages of page_size rows, the pages in a random order."""
        pages = -(-n // page_size)
        perm = torch.randperm(pages, device=device)
        out = []
        for t in (k, v):
            flat = torch.zeros(pages * page_size, HEADS_KV, HEAD_DIM, device=device, dtype=dtype)
            flat[:n] = t[0]
            p = torch.empty(pages, page_size, HEADS_KV, HEAD_DIM, device=device, dtype=dtype)
            p[perm] = flat.view(pages, page_size, HEADS_KV, HEAD_DIM)
            out.append(p)
        return out[0], out[1], perm.view(1, pages).to(torch.int32)

    def make():
        k, v = (torch.randn(1, n, HEADS_KV, HEAD_DIM, device=device, dtype=dtype) for _ in range(2))
        q = torch.randn(1, chunk, HEADS_Q, HEAD_DIM, device=device, dtype=dtype)
        lens = torch.tensor([n], dtype=torch.int32, device=device)
        k_t, v_t = (t.transpose(1, 2).contiguous() if prefix == 0 and device == "cuda" else torch.empty(0)
                    for t in (k, v))
        k_p, v_p, table = paged(k, v, PAGE_SIZE)
        k_big, v_big, table_big = paged(k, v, BIG_PAGE)
        return q, k_p, v_p, table, lens, k, v, k_t, v_t, k_big, v_big, table_big

    impls = {
        "llmk": lambda *s: llmk.attention_decode(s[Q], s[K_PAGED], s[V_PAGED], s[LENS], s[TABLE], causal=True),
        "llmk_contiguous": lambda *s: llmk.attention_decode(s[Q], s[K], s[V], s[LENS], causal=True),
        "llmk_page128": lambda *s: llmk.attention_decode(s[Q], s[K_BIG], s[V_BIG], s[LENS], s[TABLE_BIG], causal=True),
        "llmk_dense": lambda *s: llmk.attention(s[Q], s[K], s[V], causal=True),
    }
    if device == "cuda" and chunk <= 4096:
        impls["llmk_decode_kernel"] = _decode_kernel
        _decode_kernel.note = "the paged call on the decode kernel (LLMK_DECODE_PATH=decode)"
    if device == "cuda" and prefix == 0:
        impls.update({name: _sdpa(backend) for name, backend in PEERS.items()})

    def reference(*s):
        rows = slice(chunk - min(CHECK_ROWS, chunk), chunk)
        q = s[Q][0, rows, 0].double()
        k, v = s[K][0, :, 0].double(), s[V][0, :, 0].double()
        scores = q @ k.T / HEAD_DIM**0.5
        i = torch.arange(rows.start, rows.stop, device=q.device)[:, None]
        j = torch.arange(n, device=q.device)[None, :]
        scores = scores.masked_fill(j > i + prefix, float("-inf"))
        return torch.softmax(scores, -1) @ v, lambda out: out[0, rows, 0]

    return bytes_moved, make, impls, reference, flops


OPS = {"attention_paged_prefill": prefill_case}
SWEEPS = {op: (sorted({c for c, _ in points}), sorted({b for _, b in points})) for op, points in POINTS.items()}
CPU_SWEEPS = {op: ([80, 200], [0, 100]) for op in OPS}  # without a GPU: the CPU backend at small shapes
