"""Benchmark cases of the attention score variants (issue 57), forward: ops attention_window
(causal with a sliding window), attention_softcap (causal with Gemma 2's logit softcap 50) and
attention_sinks (causal with a gpt-oss sink per head). Batches of 16k tokens (one sequence from
16k up), hidden 2048 at head dim 128 (16 heads), bf16, q/k/v [batch, seq, heads, head_dim];
`tokens` is the sequence length, `hidden` the head dim. The window is 1024 keys at 4096 tokens
and 4096 (Mistral's) from 16384 (a quarter of the sequence at the CPU's small shapes).

Impls: ``llmk`` (llmk.attention with the variant; where the call is rejected, as CUDA calls are
until the kernels take the variants, it is left out with the reason printed once);
``llmk_causal`` (attention_window only: plain causal attention over the same tensors, whose time
times the fraction of the causal key blocks inside the window is what the window may cost:
the skipped blocks must cost nothing); ``flex`` (torch's FlexAttention, compiled once per
variant and shape: the window as a block mask, the softcap as a score_mod, the sinks folded in
afterwards from its lse: out * 1 / (1 + exp(sink - lse))). FLOPs: 4 * D per visible (query,
key) pair (the window's count, not the causal triangle's). The error column compares the last
256 query rows of head 0 with a float64 evaluation of the variant's definition.

Without a GPU: the CPU backend at small shapes, ``llmk`` only (FlexAttention compiles C++ on
the CPU: minutes)."""

import math

import torch

import llmk

TOKENS_PER_BATCH = 16384
HEADS = {"cuda": 16, "cpu": 2}
SEQLENS = [4096, 16384, 32768]
SOFTCAP = 50.0
CHECK_ROWS = 256
_NOTED = set()


def window_of(seqlen):
    """1024 keys at 4096 tokens, Mistral's 4096 above; a quarter of the sequence below (the CPU's
    small shapes)."""
    return seqlen // 4 if seqlen < 4096 else 1024 if seqlen == 4096 else 4096


def _visible_pairs(seqlen, window):
    """(query, key) pairs a causal row sees, with a window of `window` keys (None: causal)."""
    if window is None or window >= seqlen:
        return seqlen * (seqlen + 1) // 2
    return window * (window + 1) // 2 + (seqlen - window) * window


def _reference(variant, seqlen, sinks_of):
    """(q, k, v) -> (float64 out of the last rows of head 0, batch entry 0; their selection)."""
    def reference(q, k, v):
        rows = slice(seqlen - min(CHECK_ROWS, seqlen), seqlen)
        qd, kd, vd = q[0, rows, 0].double(), k[0, :, 0].double(), v[0, :, 0].double()
        s = qd @ kd.T / math.sqrt(qd.shape[-1])
        if variant == "softcap":
            s = SOFTCAP * torch.tanh(s / SOFTCAP)
        i = torch.arange(rows.start, rows.stop, device=q.device)[:, None]
        j = torch.arange(seqlen, device=q.device)[None, :]
        keep = j <= i
        if variant == "window":
            keep &= j > i - window_of(seqlen)
        s = s.masked_fill(~keep, float("-inf"))
        if variant == "sinks":
            sink = sinks_of(q)[0].double()
            lse = torch.logaddexp(torch.logsumexp(s, -1), sink)
            p = torch.exp(s - lse[:, None])
        else:
            p = torch.softmax(s, -1)
        return p @ vd, lambda out: out[0, rows, 0]
    return reference


def _flex(variant, seqlen, heads, device, sinks_of):
    """FlexAttention for the variant on [batch, seq, heads, D] tensors (transposed views), or None
    where it does not run here."""
    if device != "cuda":
        return None
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    window = window_of(seqlen)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def sliding(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)

    mask = create_block_mask(sliding if variant == "window" else causal, None, None, seqlen, seqlen, device=device)
    compiled = torch.compile(flex_attention, dynamic=False)

    def softcap(score, b, h, q_idx, kv_idx):
        return SOFTCAP * torch.tanh(score / SOFTCAP)

    def run(q, k, v):
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if variant == "sinks":
            out, lse = compiled(qt, kt, vt, block_mask=mask, return_lse=True)
            keep = torch.sigmoid(lse - sinks_of(q).view(1, heads, 1))  # 1 / (1 + exp(sink - lse))
            return (out * keep[..., None].to(out.dtype)).transpose(1, 2)
        return compiled(qt, kt, vt, block_mask=mask, score_mod=softcap if variant == "softcap" else None
                        ).transpose(1, 2)
    return run


def variant_case(variant):
    def case(seqlen, head_dim, dtype, device):
        batch = max(TOKENS_PER_BATCH // seqlen, 1) if device == "cuda" else 1
        heads = HEADS[device]
        elt = torch.tensor([], dtype=dtype).element_size()
        window = window_of(seqlen) if variant == "window" else None
        flops = 4 * batch * heads * head_dim * _visible_pairs(seqlen, window)
        sinks = torch.linspace(-2.0, 2.0, heads, device=device)

        def sinks_of(q):
            return sinks

        def make():
            return tuple(torch.randn(batch, seqlen, heads, head_dim, device=device, dtype=dtype) for _ in range(3))

        options = dict(window=window) if variant == "window" else \
            dict(softcap=SOFTCAP) if variant == "softcap" else dict(sinks=sinks)
        impls = {}
        sample = make()
        ours = lambda q, k, v: llmk.attention(q, k, v, causal=True, **options)  # noqa: E731
        try:
            ours(*sample)
            impls["llmk"] = ours
        except RuntimeError as e:
            if (variant, device) not in _NOTED:
                _NOTED.add((variant, device))
                print(f"attention_{variant} on {device}: llmk left out: {e}")
        if variant == "window":
            def causal(q, k, v):
                return llmk.attention(q, k, v, causal=True)
            causal.note = "plain causal attention, no window (the error column is against the window's output)"
            impls["llmk_causal"] = causal
        flex = _flex(variant, seqlen, heads, device, sinks_of)
        if flex is not None:
            impls["flex"] = flex
        del sample
        return 4 * batch * seqlen * heads * head_dim * elt, make, impls, _reference(variant, seqlen, sinks_of), flops

    return case


OPS = {"attention_window": variant_case("window"), "attention_softcap": variant_case("softcap"),
       "attention_sinks": variant_case("sinks")}
SWEEPS = {"attention_window": (SEQLENS, [128]), "attention_softcap": (SEQLENS[:2], [128]),
          "attention_sinks": (SEQLENS[:2], [128])}
CPU_SWEEPS = {op: ([64, 256], [64]) for op in OPS}  # without a GPU: the CPU backend at small shapes
