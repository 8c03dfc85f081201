"""The score variants of llmk.attention / attention_varlen / attention_decode (issue 57): sliding window, logit
softcap and attention sinks, alone and combined, on the CPU backend (the double reference the
CUDA kernels will be held to) against a float64 torch formula with the FlashAttention rule (our
max error at most 2x that of the same formula evaluated by torch in the half dtype, plus a small
atol): out and lse (the sink included), the gradients of q, k, v and the sinks, windows of 1,
odd, larger than the sequence, bottom-right alignment when seq_q != seq_k, rows that see no key
(out 0, lse = sink), GQA, varlen; the identities that tie the variants to the plain op (a window
of at least seq_k is causal; a sink of -1e30 is none; out with a sink is out without it times 1 -
p_sink); bad inputs; CUDA tensors rejected by name (the kernels take the variants later)."""

import math

import pytest
import torch

import llmk
from conftest import assert_flash_rule, requires_cuda

HALF_DTYPES = [torch.float16, torch.bfloat16]
ATOL_EPS = 0.5  # half a rounding step of the dtype at max|reference|
GRAD_ATOL_EPS = 1.0


def reference(q, k, v, causal, scale, window=None, softcap=None, sinks=None, dtype=torch.float64):
    """(out, lse) of the variants' definition (include/llmk/attention.h), evaluated in `dtype`:
    scores s = scale q.k (softcap: softcap tanh(s / softcap)), row i sees the keys j <= i + seq_k -
    seq_q (causal) and j > i + seq_k - seq_q - window (window), the sink joins the denominator.
    q [batch, seq_q, heads_q, dim], k and v [batch, seq_k, heads_kv, dim]; lse [batch, heads_q,
    seq_q] in float64."""
    seq_q, seq_k, group = q.shape[1], k.shape[1], q.shape[2] // max(k.shape[2], 1)
    qq, kk, vv = (t.to(dtype) for t in (q, k, v))
    kk, vv = kk.repeat_interleave(group, 2), vv.repeat_interleave(group, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", qq, kk) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(seq_q, device=q.device)[:, None] + seq_k - seq_q
    j = torch.arange(seq_k, device=q.device)[None, :]
    keep = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device)
    if causal:
        keep &= j <= i
    if window is not None:
        keep &= j > i - window
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        sink = sinks.to(dtype).view(1, -1, 1, 1).expand(*s.shape[:3], 1)
        lse = torch.logsumexp(torch.cat([s, sink], -1), -1)
    else:
        lse = torch.logsumexp(s, -1)
    p = torch.where(torch.isinf(lse)[..., None], torch.zeros_like(s), torch.exp(s - lse[..., None]))
    out = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    return out, lse.double()


def make(batch, seq_q, seq_k, heads_q, heads_kv, dim, dtype, sinks=False):
    q = torch.randn(batch, seq_q, heads_q, dim, dtype=dtype)
    k = torch.randn(batch, seq_k, heads_kv, dim, dtype=dtype)
    v = torch.randn(batch, seq_k, heads_kv, dim, dtype=dtype)
    s = torch.randn(heads_q, dtype=torch.float32) * 2 if sinks else None
    return q, k, v, s


# (seq_q, seq_k, causal, window, softcap, sinks)
FORWARD_CASES = [
    (17, 17, True, 1, None, False),
    (17, 17, True, 5, None, False),
    (33, 33, True, 8, None, True),
    (20, 20, True, 40, None, False),      # window larger than the sequence: causal
    (9, 30, True, 7, None, False),        # seq_q < seq_k: bottom-right window
    (30, 9, True, 3, None, True),         # seq_q > seq_k: rows without keys (out 0, lse = sink)
    (30, 9, True, None, None, True),
    (16, 24, False, None, 5.0, False),
    (16, 16, True, None, 2.0, False),
    (16, 16, False, None, None, True),
    (25, 25, True, 6, 10.0, True),        # all three
    (0, 8, False, None, 3.0, True),
    (8, 0, False, None, None, True),      # no keys at all: lse = sink
]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("dim", [32, 64])
@pytest.mark.parametrize("case", FORWARD_CASES, ids=lambda c: "q{}_k{}_{}_w{}_cap{}_{}".format(
    c[0], c[1], "causal" if c[2] else "full", c[3], c[4], "sinks" if c[5] else "nosink"))
def test_forward(dtype, dim, case):
    seq_q, seq_k, causal, window, softcap, with_sinks = case
    q, k, v, sinks = make(2, seq_q, seq_k, 4, 2, dim, dtype, with_sinks)
    scale = 1 / math.sqrt(dim)
    out, lse = llmk.attention(q, k, v, causal, scale, return_lse=True, window=window, softcap=softcap, sinks=sinks)
    want, want_lse = reference(q, k, v, causal, scale, window, softcap, sinks)
    theirs, _ = reference(q, k, v, causal, scale, window, softcap, sinks, dtype=dtype)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert_flash_rule(out, want, theirs, dtype, f"out {case}", ATOL_EPS)
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite), f"lse finiteness {case}"
    if finite.any():
        torch.testing.assert_close(lse.double()[finite], want_lse[finite], rtol=0, atol=1e-5)


def reference_grads(leaves, dout, causal, scale, window, softcap, with_sinks, dtype_):
    """The gradients of q, k, v (and the sinks) of the formula evaluated in dtype_ (the sinks in
    float32 unless dtype_ is float64), from copies of the leaves."""
    ls = [t.detach().to(dtype_ if t.dtype != torch.float32 or dtype_ == torch.float64 else torch.float32)
          .requires_grad_() for t in leaves]
    o, _ = reference(*ls[:3], causal, scale, window, softcap, ls[3] if with_sinks else None, dtype=dtype_)
    o.backward(dout.to(dtype_))
    return [t.grad if t.grad is not None else torch.zeros_like(t) for t in ls]


def backward_and_references(q, k, v, sinks, causal, scale, window, softcap, dtype):
    """llmk.attention's gradients of q, k, v (and the sinks) for a random dout, with the formula's
    in float64 (want) and in dtype (theirs): (got, want, theirs)."""
    with_sinks = sinks is not None
    dout = torch.randn_like(q)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)] + ([sinks.clone().requires_grad_()] if with_sinks else [])
    out = llmk.attention(*leaves[:3], causal, scale, window=window, softcap=softcap,
                         sinks=leaves[3] if with_sinks else None)
    out.backward(dout)
    got = [t.grad for t in leaves]
    want = reference_grads(leaves, dout, causal, scale, window, softcap, with_sinks, torch.float64)
    theirs = reference_grads(leaves, dout, causal, scale, window, softcap, with_sinks, dtype)
    return got, want, theirs


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("case", [c for c in FORWARD_CASES if c[0] <= c[1] or c[5]],
                         ids=lambda c: "q{}_k{}_{}_w{}_cap{}_{}".format(
                             c[0], c[1], "causal" if c[2] else "full", c[3], c[4], "sinks" if c[5] else "nosink"))
def test_backward(dtype, case):
    seq_q, seq_k, causal, window, softcap, with_sinks = case
    dim = 32
    q, k, v, sinks = make(2, seq_q, seq_k, 4, 2, dim, dtype, with_sinks)
    got, want, theirs = backward_and_references(q, k, v, sinks, causal, 1 / math.sqrt(dim), window, softcap, dtype)
    for name, g, w, t in zip(("dq", "dk", "dv", "dsinks"), got, want, theirs):
        assert g is not None, f"{name}: no gradient"
        if w.numel() == 0 or w.abs().max() == 0:
            assert g.double().abs().max() <= 1e-6 if g.numel() else True, f"{name}: nonzero where 0"
            continue
        assert_flash_rule(g, w, t.to(g.dtype), g.dtype if g.dtype != torch.float32 else dtype, f"{name} {case}",
                          GRAD_ATOL_EPS)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_varlen_matches_each_sequence(dtype):
    lens_q, lens_k = [5, 0, 19, 12], [9, 4, 19, 3]
    heads_q, heads_kv, dim = 4, 2, 32
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    q = torch.randn(sum(lens_q), heads_q, dim, dtype=dtype)
    k = torch.randn(sum(lens_k), heads_kv, dim, dtype=dtype)
    v = torch.randn(sum(lens_k), heads_kv, dim, dtype=dtype)
    sinks = torch.randn(heads_q)
    kw = dict(window=4, softcap=8.0, sinks=sinks)
    out, lse = llmk.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), True, 0.2, return_lse=True, **kw)
    for b in range(len(lens_q)):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        o, l = llmk.attention(q[None, qs], k[None, ks], v[None, ks], True, 0.2, return_lse=True, **kw)
        assert torch.equal(out[qs], o[0]), f"sequence {b}"
        assert torch.equal(lse[:, qs], l[0]), f"sequence {b} lse"


def test_varlen_gradients_match_each_sequence():
    """attention_varlen's autograd with the variants (its sinks gradient sums the sequences')
    against attention over each sequence alone."""
    lens_q, lens_k = [6, 0, 11], [9, 3, 11]
    heads_q, heads_kv, dim = 4, 2, 32
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    q = torch.randn(sum(lens_q), heads_q, dim, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(sum(lens_k), heads_kv, dim, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(sum(lens_k), heads_kv, dim, dtype=torch.bfloat16, requires_grad=True)
    sinks = torch.randn(heads_q, requires_grad=True)
    dout = torch.randn(sum(lens_q), heads_q, dim, dtype=torch.bfloat16)
    kw = dict(window=5, softcap=6.0)
    out = llmk.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), True, 0.2, sinks=sinks, **kw)
    dq, dk, dv, dsinks = torch.autograd.grad(out, (q, k, v, sinks), dout)
    want_dsinks = torch.zeros(heads_q)
    for b in range(len(lens_q)):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        leaves = [t.detach()[None, r].clone().requires_grad_() for t, r in ((q, qs), (k, ks), (v, ks))]
        s = sinks.detach().clone().requires_grad_()
        o = llmk.attention(*leaves, True, 0.2, sinks=s, **kw)
        grads = torch.autograd.grad(o, (*leaves, s), dout[None, qs], allow_unused=True)
        for name, got, want in (("dq", dq[qs], grads[0]), ("dk", dk[ks], grads[1]), ("dv", dv[ks], grads[2])):
            assert torch.equal(got, want[0]), f"sequence {b} {name}"
        want_dsinks += grads[3] if grads[3] is not None else 0
    torch.testing.assert_close(dsinks, want_dsinks, rtol=1e-5, atol=1e-6)


def test_identities():
    """The variants against the plain op: a window of at least seq_k is the causal mask; a sink of
    -1e30 changes nothing; a finite sink scales every row by 1 - p_sink, p_sink = exp(sink - lse);
    a softcap far above the scores changes them below the output's rounding."""
    q, k, v, _ = make(2, 12, 12, 4, 4, 64, torch.float32 if False else torch.bfloat16)
    plain, plain_lse = llmk.attention(q, k, v, True, 0.125, return_lse=True)
    windowed, windowed_lse = llmk.attention(q, k, v, True, 0.125, return_lse=True, window=12)
    assert torch.equal(plain, windowed) and torch.equal(plain_lse, windowed_lse)
    none = torch.full((4,), -1e30)
    o, lse = llmk.attention(q, k, v, True, 0.125, return_lse=True, sinks=none)
    assert torch.equal(o, plain) and torch.equal(lse, plain_lse)
    sinks = torch.tensor([0.0, 1.0, -2.0, 3.0])
    o, lse = llmk.attention(q, k, v, True, 0.125, return_lse=True, sinks=sinks)
    torch.testing.assert_close(lse.double(), torch.logaddexp(plain_lse.double(), sinks.double().view(1, 4, 1)),
                               rtol=0, atol=1e-5)
    p_sink = torch.exp(sinks.view(1, 4, 1) - lse).transpose(1, 2)[..., None]  # [batch, seq, heads, 1]
    torch.testing.assert_close(o.float(), plain.float() * (1 - p_sink), rtol=2**-7, atol=2**-8)
    capped = llmk.attention(q, k, v, True, 0.125, softcap=1e6)
    assert (capped.float() - plain.float()).abs().max() <= 2**-7 * plain.float().abs().max()


def assert_sequence_matches(out, lse, args, dtype, what, lse_atol):
    """One sequence's out [1, L, Hq, D] and lse [1, Hq, L] of a decode call against the prefill
    formula over its keys (args: reference's): the FlashAttention rule on out, lse's infinities
    where the formula's are and its finite values within lse_atol."""
    want, want_lse = reference(*args)
    theirs, _ = reference(*args, dtype=dtype)
    assert_flash_rule(out, want, theirs, dtype, what, ATOL_EPS)
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite), f"{what}: lse finiteness"
    torch.testing.assert_close(lse.double()[finite], want_lse[finite], rtol=0, atol=lse_atol)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("variants", [dict(window=1), dict(window=4, sinks=True), dict(softcap=6.0),
                                      dict(sinks=True), dict(window=5, softcap=3.0, sinks=True)], ids=str)
def test_decode_matches_the_prefill_definition(dtype, q_len, variants):
    """llmk.attention_decode over a contiguous cache with the variants: each sequence's q tokens
    are the last q_len of its cache_seqlens keys, so the prefill formula over those keys (causal,
    bottom-right) is its reference; lengths of 1 (a q_len 3 row then sees no key) and 0."""
    heads_q, heads_kv, dim, max_len = 4, 2, 64, 24
    lens = [7, 1, 20, 0]
    k_cache = torch.randn(len(lens), max_len, heads_kv, dim, dtype=dtype)
    v_cache = torch.randn(len(lens), max_len, heads_kv, dim, dtype=dtype)
    q = torch.randn(len(lens), q_len, heads_q, dim, dtype=dtype)
    kw = dict(variants)
    sinks = torch.randn(heads_q) if kw.pop("sinks", False) else None
    out, lse = llmk.attention_decode(q, k_cache, v_cache, torch.tensor(lens, dtype=torch.int32), causal=True,
                                     scale=0.125, return_lse=True, sinks=sinks, **kw)
    for b, n in enumerate(lens):
        args = (q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n], True, 0.125, kw.get("window"),
                kw.get("softcap"), sinks)
        assert_sequence_matches(out[b:b + 1], lse[b:b + 1], args, dtype, f"decode sequence {b}", 1e-5)


def test_decode_bad_inputs():
    k_cache = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
    q = torch.randn(1, 1, 4, 64, dtype=torch.bfloat16)
    lens = torch.tensor([5], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="attention_decode: window needs causal=true"):
        llmk.attention_decode(q, k_cache, k_cache.clone(), lens, causal=False, window=3)
    with pytest.raises(RuntimeError, match=r"attention_decode: sinks must be float32 \[heads_q\] = \[4\]"):
        llmk.attention_decode(q, k_cache, k_cache.clone(), lens, sinks=torch.zeros(2))
    with pytest.raises(RuntimeError, match="attention_decode: softcap must be finite and > 0"):
        llmk.attention_decode(q, k_cache, k_cache.clone(), lens, softcap=0.0)


BAD = [
    (dict(window=0, causal=True), "window must be >= 1"),
    (dict(window=-3, causal=True), "window must be >= 1"),
    (dict(window=4, causal=False), "window needs causal=true"),
    (dict(softcap=0.0), "softcap must be finite and > 0"),
    (dict(softcap=-1.0), "softcap must be finite and > 0"),
    (dict(softcap=float("nan")), "softcap must be finite and > 0"),
    (dict(sinks=torch.zeros(3)), "sinks must be float32 [heads_q] = [4]"),
    (dict(sinks=torch.zeros(4, dtype=torch.bfloat16)), "sinks has dtype bfloat16, expected float32"),
    (dict(sinks=torch.zeros(4, 2)[:, 0]), "sinks must be contiguous"),
]


@pytest.mark.parametrize("kwargs,needle", BAD, ids=[b[1][:24] + str(i) for i, b in enumerate(BAD)])
def test_bad_inputs(kwargs, needle):
    q, k, v, _ = make(1, 6, 6, 4, 2, 32, torch.float16)
    kwargs = dict(kwargs)
    causal = kwargs.pop("causal", False)
    with pytest.raises(RuntimeError) as info:
        llmk.attention(q, k, v, causal, **kwargs)
    assert needle in str(info.value) and "attention" in str(info.value)


@requires_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("q_len", [1, 4])
@pytest.mark.parametrize("batch,max_len", [(1, 40000), (3, 3000)], ids=["long_split", "batch"])
@pytest.mark.parametrize("variants", [dict(window=4096), dict(window=7, sinks=True), dict(softcap=30.0),
                                      dict(sinks=True), dict(window=1000, softcap=50.0, sinks=True)], ids=str)
@pytest.mark.parametrize("merge", ["auto", "kernel", "cluster"])
def test_cuda_decode(monkeypatch, dtype, q_len, batch, max_len, variants, merge):
    """The GPU decode kernel (split-KV pieces merged in a cluster or by the merge kernel:
    LLMK_DECODE_MERGE) with the variants against the prefill formula per sequence."""
    monkeypatch.setenv("LLMK_DECODE_MERGE", merge)
    heads_q, heads_kv, dim = 32, 8, 128
    lens = torch.randint(max_len // 2, max_len - q_len, (batch,), dtype=torch.int32)
    k_cache = torch.randn(batch, max_len, heads_kv, dim, dtype=dtype, device="cuda")
    v_cache = torch.randn(batch, max_len, heads_kv, dim, dtype=dtype, device="cuda")
    q = torch.randn(batch, q_len, heads_q, dim, dtype=dtype, device="cuda")
    kw = dict(variants)
    sinks = torch.randn(heads_q, device="cuda") if kw.pop("sinks", False) else None
    out, lse = llmk.attention_decode(q, k_cache, v_cache, lens.cuda(), causal=True, scale=dim**-0.5,
                                     return_lse=True, sinks=sinks, **kw)
    for b, n in enumerate(lens.tolist()):
        args = (q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n], True, dim**-0.5, kw.get("window"),
                kw.get("softcap"), sinks)
        assert_sequence_matches(out[b:b + 1], lse[b:b + 1], args, dtype, f"cuda decode sequence {b}", 2e-3)


@requires_cuda
@pytest.mark.parametrize("dim,heads_q,heads_kv", [(64, 64, 8), (96, 32, 32), (256, 16, 8)])
@pytest.mark.parametrize("fp8", [False, True], ids=["cache_like_q", "fp8_cache"])
def test_cuda_decode_tiles(dim, heads_q, heads_kv, fp8):
    """The decode variant tiles of the other head dims, an fp8 cache (against the dequantized
    values) behind a shuffled page table, and q_len x group > 16 query rows (several 16-row
    blocks per kv head: the variant calls take the 16-row tiles only)."""
    dtype, batch, q_len, page, pages_per_seq = torch.bfloat16, 2, 7, 16, 300
    lens = [3001, 4321]
    kf = torch.randn(batch * pages_per_seq, page, heads_kv, dim, device="cuda")
    vf = torch.randn(batch * pages_per_seq, page, heads_kv, dim, device="cuda")
    if fp8:
        k_scale = torch.rand(heads_kv, device="cuda") + 0.5
        v_scale = torch.rand(heads_kv, device="cuda") + 0.5
        k_cache = (kf / k_scale.view(1, 1, -1, 1)).to(torch.float8_e4m3fn)
        v_cache = (vf / v_scale.view(1, 1, -1, 1)).to(torch.float8_e4m3fn)
        kf, vf = k_cache.float() * k_scale.view(1, 1, -1, 1), v_cache.float() * v_scale.view(1, 1, -1, 1)
    else:
        k_scale = v_scale = None
        k_cache, v_cache = kf.to(dtype), vf.to(dtype)
        kf, vf = k_cache.float(), v_cache.float()
    table = torch.randperm(batch * pages_per_seq, device="cuda").view(batch, pages_per_seq).int()
    q = torch.randn(batch, q_len, heads_q, dim, dtype=dtype, device="cuda")
    sinks = torch.randn(heads_q, device="cuda")
    scale, window, softcap = dim**-0.5, 777, 40.0
    out, lse = llmk.attention_decode(q, k_cache, v_cache, torch.tensor(lens, dtype=torch.int32, device="cuda"),
                                     block_table=table, causal=True, scale=scale, return_lse=True, k_scale=k_scale,
                                     v_scale=v_scale, window=window, softcap=softcap, sinks=sinks)
    for b, n in enumerate(lens):
        k = kf[table[b].long()].flatten(0, 1)[None, :n]
        v = vf[table[b].long()].flatten(0, 1)[None, :n]
        args = (q[b:b + 1], k, v, True, scale, window, softcap, sinks)
        assert_sequence_matches(out[b:b + 1], lse[b:b + 1], args, dtype, f"cuda decode tiles sequence {b}", 2e-3)


def hopper_forward():
    """Whether the Hopper forward runs here (it alone takes the variants on the GPU)."""
    return (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
            and "90a" in llmk._C.build_cuda_archs().split(";"))


CUDA_CASES = [  # (seq_q, seq_k, causal, window, softcap, sinks) around the 128-row / 128-key tiles
    (300, 300, True, 1, None, False),
    (1000, 1000, True, 129, None, False),
    (777, 1300, True, 257, 30.0, True),
    (513, 200, True, 64, None, True),      # rows without keys
    (640, 640, False, None, 50.0, False),
    (1024, 1024, True, None, None, True),
    (4096, 4096, True, 1024, None, False),  # most key blocks skipped
]


@requires_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("dim", [64, 128, 256])
@pytest.mark.parametrize("case", CUDA_CASES, ids=lambda c: "q{}_k{}_{}_w{}_cap{}_{}".format(
    c[0], c[1], "causal" if c[2] else "full", c[3], c[4], "sinks" if c[5] else "nosink"))
def test_cuda_forward(dtype, dim, case):
    if not hopper_forward():
        pytest.skip("the variants run on the Hopper forward only")
    seq_q, seq_k, causal, window, softcap, with_sinks = case
    q, k, v, sinks = (None if t is None else t.cuda() for t in make(1, seq_q, seq_k, 8, 2, dim, dtype, with_sinks))
    scale = 1 / math.sqrt(dim)
    want, want_lse = reference(q, k, v, causal, scale, window, softcap, sinks)  # float64 on the GPU
    theirs, _ = reference(q, k, v, causal, scale, window, softcap, sinks, dtype=dtype)
    out, lse = llmk.attention(q, k, v, causal, scale, return_lse=True, window=window, softcap=softcap, sinks=sinks)
    assert_flash_rule(out, want, theirs, dtype, f"cuda out {case}", ATOL_EPS)
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse.double()[finite], want_lse[finite], rtol=0, atol=2e-3)


@requires_cuda
@pytest.mark.parametrize("dim", [64, 128, 256])
def test_cuda_varlen_forward(dim):
    """The Hopper forward's varlen walk with the variants: each sequence's window, rows and keys
    from its own offsets (lengths around the 128-row tiles, an empty one, seq_q != seq_k) against
    the float64 formula per sequence."""
    if not hopper_forward():
        pytest.skip("the variants run on the Hopper forward only")
    dtype, lens_q, lens_k = torch.bfloat16, [300, 0, 129, 517], [300, 40, 400, 517]
    heads_q, heads_kv = 8, 2
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lens_q), heads_q, dim, dtype=dtype, device="cuda")
    k = torch.randn(sum(lens_k), heads_kv, dim, dtype=dtype, device="cuda")
    v = torch.randn(sum(lens_k), heads_kv, dim, dtype=dtype, device="cuda")
    sinks = torch.randn(heads_q, device="cuda")
    kw = dict(window=131, softcap=20.0, sinks=sinks)
    scale = dim**-0.5
    out, lse = llmk.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), True, scale, return_lse=True, **kw)
    for b in range(len(lens_q)):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if lens_q[b] == 0:
            continue
        args = (q[None, qs], k[None, ks], v[None, ks], True, scale, kw["window"], kw["softcap"], sinks)
        want, want_lse = reference(*args)
        theirs, _ = reference(*args, dtype=dtype)
        assert_flash_rule(out[None, qs], want, theirs, dtype, f"cuda varlen sequence {b}", ATOL_EPS)
        torch.testing.assert_close(lse[:, qs].double(), want_lse[0], rtol=0, atol=2e-3)


@requires_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("dim", [64, 128, 256])
@pytest.mark.parametrize("case", CUDA_CASES, ids=lambda c: "q{}_k{}_{}_w{}_cap{}_{}".format(
    c[0], c[1], "causal" if c[2] else "full", c[3], c[4], "sinks" if c[5] else "nosink"))
def test_cuda_backward(dtype, dim, case):
    """The Hopper backward with the variants (the window's walks end at the last query tile
    that sees a key block; softcap's chain rule from P itself): dq, dk, dv and the sinks'
    gradient against the float64 formula's autograd by the FlashAttention rule."""
    if not hopper_forward():
        pytest.skip("the variants run on the Hopper kernels only")
    seq_q, seq_k, causal, window, softcap, with_sinks = case
    q, k, v, sinks = (None if t is None else t.cuda() for t in make(1, seq_q, seq_k, 8, 2, dim, dtype, with_sinks))
    got, want, theirs = backward_and_references(q, k, v, sinks, causal, 1 / math.sqrt(dim), window, softcap, dtype)
    # A window of 1 on the diagonal gives each query one key: dq and dk are zero by identity (dS =
    # P (dP - D) with P = 1, O = V), so the kernel's rounding of O is held to dv's scale.
    grad_scale = max(w.abs().max().item() for w in want[:3])
    for name, g, w, t in zip(("dq", "dk", "dv", "dsinks"), got, want, theirs):
        zero = name in ("dq", "dk") and not w.abs().max()
        assert_flash_rule(g, w, t.to(g.dtype), g.dtype if g.dtype != torch.float32 else dtype, f"cuda {name} {case}",
                          GRAD_ATOL_EPS, scale=grad_scale if zero else None)


@requires_cuda
@pytest.mark.parametrize("deterministic", [False, True])
def test_cuda_varlen_backward(deterministic):
    """The Hopper backward's varlen walks with a window and softcap (GQA, an empty sequence,
    seq_q != seq_k; deterministic: the dq turns over windowed walks) against the float64
    formula per sequence."""
    if not hopper_forward():
        pytest.skip("the variants run on the Hopper kernels only")
    dtype, dim, lens_q, lens_k = torch.bfloat16, 128, [300, 0, 129, 517], [300, 40, 400, 517]
    heads_q, heads_kv = 8, 2
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lens_q), heads_q, dim, dtype=dtype, device="cuda", requires_grad=True)
    k = torch.randn(sum(lens_k), heads_kv, dim, dtype=dtype, device="cuda", requires_grad=True)
    v = torch.randn(sum(lens_k), heads_kv, dim, dtype=dtype, device="cuda", requires_grad=True)
    dout = torch.randn(sum(lens_q), heads_q, dim, dtype=dtype, device="cuda")
    kw, scale = dict(window=131, softcap=20.0), dim**-0.5
    out = llmk.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), True, scale, deterministic=deterministic,
                                **kw)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    for b in range(len(lens_q)):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))

        def grads(dtype_):
            ls = [t.detach()[None, r].to(dtype_).requires_grad_() for t, r in ((q, qs), (k, ks), (v, ks))]
            o, _ = reference(*ls, True, scale, kw["window"], kw["softcap"], dtype=dtype_)
            o.backward(dout[None, qs].to(dtype_))
            return [t.grad[0] for t in ls]

        want, theirs = grads(torch.float64), grads(dtype)
        for name, g, w, t in zip(("dq", "dk", "dv"), (dq[qs], dk[ks], dv[ks]), want, theirs):
            if w.numel() == 0:
                continue
            assert_flash_rule(g, w, t, dtype, f"cuda varlen {name} sequence {b}", GRAD_ATOL_EPS)


@requires_cuda
def test_cuda_rejects_what_its_kernels_do_not_take(monkeypatch):
    """The sm_80 kernels take no variant: forced onto them (LLMK_ATTENTION_PATH=sm80), the forward
    and the backward with one are rejected before any work."""
    q, k, v, _ = make(1, 8, 8, 4, 2, 64, torch.bfloat16)
    q, k, v = q.cuda().requires_grad_(), k.cuda(), v.cuda()
    if hopper_forward():
        out = llmk.attention(q, k, v, True, window=4)
        monkeypatch.setenv("LLMK_ATTENTION_PATH", "sm80")
        with pytest.raises(RuntimeError, match="run on the Hopper backward"):
            out.sum().backward()
    monkeypatch.setenv("LLMK_ATTENTION_PATH", "sm80")
    with torch.no_grad(), pytest.raises(RuntimeError, match="run on the Hopper forward"):
        llmk.attention(q, k, v, True, softcap=5.0)
