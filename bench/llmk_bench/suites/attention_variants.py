"""Benchmark cases of the attention score variants (issue 57), forward: ops attention_window
(causal with a sliding window), attention_softcap (causal with Gemma 2's logit softcap 50) and
attention_sinks (causal with a gpt-oss sink per head); a training step's (forward and backward
through autograd timed together, the sinks held constant): the same ops with ``_train``. Batches of 16k tokens (one sequence from
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
key) pair (the window's count, not the causal triangle's), 3.5x that for a training step (2
GEMMs + 5). The error column compares the last 256 query rows of head 0 (of out; of dq for a
training step) with a float64 evaluation of the variant's definition.

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


def _setup(variant, seqlen, head_dim, dtype, device):
    """(batch, heads, bytes of one q/k/v/out tensor, llmk.attention's options, the constant
    sinks, forward FLOPs) of a case."""
    batch = max(TOKENS_PER_BATCH // seqlen, 1) if device == "cuda" else 1
    heads = HEADS[device]
    elt = torch.tensor([], dtype=dtype).element_size()
    window = window_of(seqlen) if variant == "window" else None
    sinks = torch.linspace(-2.0, 2.0, heads, device=device)
    options = dict(window=window) if variant == "window" else \
        dict(softcap=SOFTCAP) if variant == "softcap" else dict(sinks=sinks)
    flops = 4 * batch * heads * head_dim * _visible_pairs(seqlen, window)
    return batch, heads, batch * seqlen * heads * head_dim * elt, options, sinks, flops


def _impls(variant, seqlen, heads, device, options, sinks, sample, wrap, what):
    """llmk (left out, with the reason printed once, where it rejects the call), the window's
    plain-causal yardstick, FlexAttention; each forward (q, k, v) -> out passed through `wrap`
    (the forward itself, or its training step) and tried once on `sample`."""
    impls = {}
    ours = wrap(lambda q, k, v: llmk.attention(q, k, v, causal=True, **options))
    try:
        ours(*sample)
        impls["llmk"] = ours
    except RuntimeError as e:
        if (what, device) not in _NOTED:
            _NOTED.add((what, device))
            print(f"{what} on {device}: llmk left out: {e}")
    if variant == "window":
        causal = wrap(lambda q, k, v: llmk.attention(q, k, v, causal=True))
        causal.note = "plain causal attention, no window (the error column is against the window's)"
        impls["llmk_causal"] = causal
    flex = _flex(variant, seqlen, heads, device, lambda q: sinks)
    if flex is not None:
        impls["flex"] = wrap(flex)
    return impls


def variant_case(variant):
    def case(seqlen, head_dim, dtype, device):
        batch, heads, tensor_bytes, options, sinks, flops = _setup(variant, seqlen, head_dim, dtype, device)

        def make():
            return tuple(torch.randn(batch, seqlen, heads, head_dim, device=device, dtype=dtype) for _ in range(3))

        sample = make()
        impls = _impls(variant, seqlen, heads, device, options, sinks, sample, lambda f: f, f"attention_{variant}")
        del sample
        return 4 * tensor_bytes, make, impls, _reference(variant, seqlen, lambda q: sinks), flops

    return case


def variant_train_case(variant):
    """A training step of the variant: out = attention(q, k, v) and torch.autograd.grad of q, k,
    v for a random dout, timed together."""
    def case(seqlen, head_dim, dtype, device):
        batch, heads, tensor_bytes, options, sinks, flops = _setup(variant, seqlen, head_dim, dtype, device)

        def make():
            q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device=device, dtype=dtype, requires_grad=True)
                       for _ in range(3))
            return q, k, v, torch.randn(batch, seqlen, heads, head_dim, device=device, dtype=dtype)

        def step(forward):
            def run(q, k, v, dout):
                return torch.autograd.grad(forward(q, k, v), (q, k, v), dout)
            if hasattr(forward, "note"):
                run.note = forward.note
            return run

        sample = make()
        impls = _impls(variant, seqlen, heads, device, options, sinks, sample, step, f"attention_{variant}_train")
        del sample
        forward_reference = _reference(variant, seqlen, lambda q: sinks)

        def reference(q, k, v, dout):
            """dq of the last rows of head 0 (batch entry 0) by float64 autograd of the definition."""
            rows = slice(seqlen - min(CHECK_ROWS, seqlen), seqlen)
            qd = q.detach().double().requires_grad_()
            out, select = forward_reference(qd, k.detach().double(), v.detach().double())
            (dq,) = torch.autograd.grad(out, qd, dout[0, rows, 0].double())
            return dq[0, rows, 0], lambda got: got[0, rows, 0]  # got: the step's first gradient, dq

        # Bytes: the forward's q, k, v, out and the backward's q, k, v, out, dout, dq, dk, dv.
        return 12 * tensor_bytes, make, impls, reference, flops * 7 // 2

    return case


OPS = {f"attention_{v}{t}": (variant_train_case if t else variant_case)(v)
       for v in ("window", "softcap", "sinks") for t in ("", "_train")}
SWEEPS = {op: (SEQLENS if op.startswith("attention_window") else SEQLENS[:2], [128]) for op in OPS}
CPU_SWEEPS = {op: ([64, 256], [64]) for op in OPS}  # without a GPU: the CPU backend at small shapes
