"""Benchmark cases of the decode attention (llmk.attention_decode): one decode step of a batch of
sequences against their KV cache, GQA 32 query / 8 kv heads, head dim 128, bf16 q. `tokens` is
the context (the cached keys of every sequence), `hidden` the batch.

Ops (the CSV's op column):
- ``attention_decode``: a contiguous bf16 cache [batch, context, 8, 128], q_len 1;
- ``attention_decode_paged``: the same keys in pages of 16 tokens, the pages in a random order
  (block_table); impl ``llmk_contiguous`` is the contiguous call on the same keys, in the same run;
- ``attention_decode_fp8``: the contiguous cache in float8 e4m3 with per-head scales (half the
  bytes); impl ``llmk_bf16`` is the call on the bf16 cache of the same (dequantized) values;
- ``attention_decode_qlen4``: q_len 4 (speculative-decoding verification), causal bottom-right,
  on the contiguous bf16 cache.
Points (batch x context): 1x1024, 1x8192, 1x32768, 16x8192, 64x4096; qlen4 at 1x32768 and
16x8192 (POINTS; the harness's --tokens / --hidden run their cross product instead).

Bytes: the K and V of the cache, 2 * batch * context * 8 * 128 * element size (1 for fp8); q and
out add < 0.1%. gbs = those bytes / time for every impl of a row, so a peer that reads more (a
bf16 cache in the fp8 rows, K/V expanded to the 32 query heads) says so in the note column.

Peers: torch.nn.functional.scaled_dot_product_attention with its backend forced by sdpa_kernel
(``cudnn``: cuDNN's attention, ``flash``: FlashAttention 2) on the equivalent contiguous bf16
cache in PyTorch's [batch, heads, seq, dim] layout (its own copy). GQA, probed on each case in
this order: enable_gqa=True (FlashAttention's way); the 8 kv heads without the flag (cuDNN has
taken heads_kv dividing heads_q as they are, and refused the flag: pytorch/pytorch#139586); K/V
expanded to 32 heads once, outside the timing. The note column says which, when not the first. q_len 4: the peers run without a mask (their
causal mask aligns top-left; 3 of the >= 8192 keys differ, nothing measurable) and the note
says so; llmk's call is causal. A peer that runs in neither form is left out with a note.

Timing: the harness's protocol (a CUDA graph of >= 20 calls, the median of 7 replays, input sets
rotated through >= 256 MiB so that the cache streams from HBM); the op allocates its split-KV
workspace through torch, from the graph's pool. max_rel_err: sequence 0, all heads, against a
float64 reference (fp8: of the dequantized cache).
Without a GPU: the CPU backend at contexts 256 and 1024, batch 1 and 4, beside SDPA's flash
backend where it runs on the CPU (cudnn does not: skipped with a note).
Each case is case(context, batch, dtype, device) -> (bytes moved, make, impls, reference)."""

import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import llmk

HEADS_Q, HEADS_KV, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16
PEERS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
_MAIN = [(1024, 1), (8192, 1), (32768, 1), (8192, 16), (4096, 64)]  # (tokens = context, hidden = batch)
POINTS = {"attention_decode": _MAIN, "attention_decode_paged": _MAIN, "attention_decode_fp8": _MAIN,
          "attention_decode_qlen4": [(32768, 1), (8192, 16)]}
# Each input set: llmk's arguments, then the copies the other impls read (empty where unused).
Q, K_CACHE, V_CACHE, LENS, TABLE, K_SCALE, V_SCALE, K_BF16, V_BF16, K_T, V_T, K_X, V_X = range(13)
_NOTED = set()


def _note_once(text):
    if text not in _NOTED:
        _NOTED.add(text)
        print(text, flush=True)


def _maybe(t):
    return t if t.numel() else None


def _llmk(causal, k=K_CACHE, v=V_CACHE, paged=True, scaled=True):
    """llmk.attention_decode on the set's cache (or its bf16 copy: k=K_BF16, v=V_BF16)."""
    def run(*s):
        return llmk.attention_decode(s[Q], s[k], s[v], s[LENS], _maybe(s[TABLE]) if paged else None, causal=causal,
                                     k_scale=_maybe(s[K_SCALE]) if scaled else None,
                                     v_scale=_maybe(s[V_SCALE]) if scaled else None)
    return run


# How a peer sees GQA, in the order tried: enable_gqa=True on the 8-head copy; the 8-head copy
# without the flag (cuDNN has taken heads_kv dividing heads_q as they are); K/V expanded to 32 heads.
GQA_MODES = ("enable_gqa", "heads_as_is", "expanded")


def _sdpa(backend, mode):
    """SDPA on the [batch, heads, seq, dim] copy, out as [B, L, H, D]."""
    k, v = (K_X, V_X) if mode == "expanded" else (K_T, V_T)

    def run(*s):
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(s[Q].transpose(1, 2), s[k], s[v], enable_gqa=mode == "enable_gqa")
        return out.transpose(1, 2)
    return run


def _runs(fn, sample):
    try:
        with warnings.catch_warnings():  # a backend that declines says why in a warning: the note says it once
            warnings.simplefilter("ignore")
            fn(*sample)
        if sample[Q].is_cuda:
            torch.cuda.synchronize()
        return True
    except RuntimeError:
        return False


def decode_case(kind):
    """kind: contiguous, paged, fp8 or qlen4."""
    q_len = 4 if kind == "qlen4" else 1

    def case(context, batch, dtype, device):
        fp8 = kind == "fp8"
        elt = 1 if fp8 else torch.tensor([], dtype=dtype).element_size()
        bytes_moved = 2 * batch * context * HEADS_KV * HEAD_DIM * elt
        empty = torch.empty(0, device=device)
        expand = {"needed": False}

        def make():
            base = [torch.randn(batch, context, HEADS_KV, HEAD_DIM, device=device, dtype=dtype) for _ in range(2)]
            s = [empty] * 13
            s[Q] = torch.randn(batch, q_len, HEADS_Q, HEAD_DIM, device=device, dtype=dtype)
            s[LENS] = torch.full((batch,), context, dtype=torch.int32, device=device)
            s[K_CACHE], s[V_CACHE] = base
            if kind == "paged":  # logical page i of the batch stored at page perm[i]
                pages = batch * context // PAGE_SIZE
                perm = torch.randperm(pages, device=device)
                for i in (K_CACHE, V_CACHE):
                    paged = torch.empty(pages, PAGE_SIZE, HEADS_KV, HEAD_DIM, device=device, dtype=dtype)
                    paged[perm] = base[i - K_CACHE].view(pages, PAGE_SIZE, HEADS_KV, HEAD_DIM)
                    s[i] = paged
                s[TABLE] = perm.view(batch, context // PAGE_SIZE).to(torch.int32)
                s[K_BF16], s[V_BF16] = base
            if fp8:  # stored x / scale; the bf16 copies hold the dequantized values
                for i, scale_i in ((K_CACHE, K_SCALE), (V_CACHE, V_SCALE)):
                    s[scale_i] = torch.rand(HEADS_KV, device=device) + 0.5
                    s[i] = (base[i - K_CACHE].float() / s[scale_i][:, None]).to(torch.float8_e4m3fn)
                    base[i - K_CACHE] = (s[i].float() * s[scale_i][:, None]).to(dtype)
                s[K_BF16], s[V_BF16] = base
            s[K_T], s[V_T] = (t.transpose(1, 2).contiguous() for t in base)
            if expand["needed"]:
                s[K_X], s[V_X] = (t.repeat_interleave(HEADS_Q // HEADS_KV, 1) for t in (s[K_T], s[V_T]))
            return tuple(s)

        impls = {"llmk": _llmk(causal=True)}
        if kind == "paged":
            impls["llmk_contiguous"] = _llmk(True, K_BF16, V_BF16, paged=False)
        if fp8:
            impls["llmk_bf16"] = _llmk(True, K_BF16, V_BF16, scaled=False)
        sample = make()
        for name, backend in PEERS.items():
            for mode in GQA_MODES:
                if mode == "expanded":
                    sample = list(sample)
                    sample[K_X], sample[V_X] = (t.repeat_interleave(HEADS_Q // HEADS_KV, 1)
                                                for t in (sample[K_T], sample[V_T]))
                fn = _sdpa(backend, mode)
                if _runs(fn, sample):
                    break
            else:
                _note_once(f"attention_decode on {device}: SDPA's {name} backend runs neither with enable_gqa, nor "
                           f"on {HEADS_KV} kv heads as they are, nor on K/V expanded ({batch} x {context}); left out")
                continue
            impls[name] = fn
            note = []
            if mode == "heads_as_is":
                note.append(f"{HEADS_KV} kv heads without enable_gqa (refused with it)")
            if mode == "expanded":
                expand["needed"] = True
                note.append(f"K/V expanded to {HEADS_Q} heads ({name} refuses {HEADS_KV} kv heads): it reads 4x the "
                            f"bytes; gbs counts the {HEADS_KV}-head cache")
            if fp8:
                note.append("reads the bf16 cache (2x the fp8 bytes); gbs counts the fp8 cache")
            if q_len > 1:
                note.append("no mask (SDPA's is_causal aligns top-left; llmk is causal bottom-right: 3 of the keys "
                            "differ)")
            fn.note = "; ".join(note)
        if fp8:
            impls["llmk_bf16"].note = "the bf16 cache of the same values (2x the bytes); gbs counts the fp8 cache"
        del sample

        def reference(*s):
            """Sequence 0, every head, in float64 (fp8: the dequantized cache)."""
            if fp8:
                k, v = (s[i][0].double() * s[j].double()[:, None] for i, j in ((K_CACHE, K_SCALE), (V_CACHE, V_SCALE)))
            else:
                k, v = (s[i][0].transpose(0, 1).double() for i in (K_T, V_T))  # [context, kv heads, dim]
            group = HEADS_Q // HEADS_KV
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            scores = torch.einsum("lhd,nhd->hln", s[Q][0].double(), k) / HEAD_DIM**0.5
            if q_len > 1:  # token i sees keys j <= i + context - q_len
                i = torch.arange(q_len, device=k.device)[:, None]
                j = torch.arange(context, device=k.device)[None, :]
                scores = scores.masked_fill(j > i + context - q_len, float("-inf"))
            return torch.einsum("hln,nhd->lhd", torch.softmax(scores, -1), v), lambda out: out[0]

        return bytes_moved, make, impls, reference

    return case


OPS = {"attention_decode": decode_case("contiguous"), "attention_decode_paged": decode_case("paged"),
       "attention_decode_fp8": decode_case("fp8"), "attention_decode_qlen4": decode_case("qlen4")}
SWEEPS = {op: (sorted({c for c, _ in points}), sorted({b for _, b in points})) for op, points in POINTS.items()}
CPU_SWEEPS = {op: ([256, 1024], [1, 4]) for op in OPS}  # without a GPU: the CPU backend at small shapes
