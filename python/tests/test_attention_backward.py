"""Gradients of llmk.attention / attention_varlen / scaled_dot_product_attention (autograd through
attention_backward and attention_varlen_backward): the CPU backend and the CUDA kernel against
float64 autograd with the FlashAttention rule (our max error at most 2x that of PyTorch's own
attention in the same dtype against the same reference, plus one rounding step of the dtype at
the gradient's scale), over head dims, causal masks (bottom-right; rows that see no key: dq 0
and nothing to dk/dv), GQA group sizes, lengths around the tiles, fused-qkv slices (the unused
head's gradient stays 0), transposed layouts, packed variable-length batches with empty
sequences; deterministic runs bitwise equal; a directional-derivative (gradcheck-style) check
through the CPU path; torch.compile over forward and backward; a few training steps of a tiny
attention model against the same model on PyTorch's attention; bad inputs.

The CUDA cases run the forward and the backward on each path (LLMK_ATTENTION_PATH = sm80, sm90,
auto, as test_attention.py's; the Hopper backward takes head dims 64 and 128)."""

import math

import pytest
import torch
import torch.nn.functional as F

import llmk
from conftest import DEVICES, assert_flash_rule, poison_allocator, requires_cuda
from test_attention import (HALF_DTYPES, TARGETS, VARLEN_CASES, _packed, make_qkv, needs_kernel, on_path,
                            rows_without_keys, use_path)

ATOL_EPS = 1  # the rule's slack: one rounding step of the dtype at max|reference gradient|


def _mask(seq_q, seq_k, causal, device):
    """(keep [seq_q, seq_k] or None, empty [seq_q]): the bottom-right causal mask, and the rows that
    see no key."""
    if not causal:
        return None, torch.zeros(seq_q, dtype=torch.bool, device=device)
    i = torch.arange(seq_q, device=device)[:, None]
    keep = torch.arange(seq_k, device=device)[None, :] <= i + seq_k - seq_q
    return keep, ~keep.any(-1)


def reference_grads(q, k, v, dout, causal, scale, sdpa=False):
    """(dq, dk, dv) by autograd: float64 math (the oracle), or with sdpa PyTorch's SDPA in q's dtype
    (the rule's yardstick). A row that sees no key has a zero gradient everywhere; it is unmasked
    and its dout zeroed here (SDPA would make it NaN)."""
    seq_q, seq_k, group = q.shape[1], k.shape[1], q.shape[2] // k.shape[2]
    if seq_q == 0 or seq_k == 0:
        return torch.zeros_like(q, dtype=torch.float64), torch.zeros_like(k, dtype=torch.float64), \
            torch.zeros_like(v, dtype=torch.float64)
    dtype = q.dtype if sdpa else torch.float64
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    qq, kk, vv = leaves
    keep, empty = _mask(seq_q, seq_k, causal, q.device)
    if keep is not None:
        keep = keep | empty[:, None]
    kk, vv = kk.repeat_interleave(group, 2), vv.repeat_interleave(group, 2)
    if sdpa:
        out = F.scaled_dot_product_attention(qq.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2),
                                             attn_mask=keep, scale=scale).transpose(1, 2)
    else:
        s = torch.einsum("bqhd,bkhd->bhqk", qq, kk) * scale
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), vv)
    out.backward(dout.masked_fill(empty[None, :, None, None], 0).to(dtype))
    return tuple(t.grad for t in leaves)


def assert_grads(got, q, k, v, dout, causal, scale, what=""):
    """The FlashAttention rule for each of (dq, dk, dv)."""
    want = reference_grads(q, k, v, dout, causal, scale)
    theirs = reference_grads(q, k, v, dout, causal, scale, sdpa=True)
    # A gradient that is exactly 0 (every row's probability on one key, so dS = P (dP - D)
    # cancels) keeps the fp32 rounding of its uncancelled terms, ~ scale |q| |dout| |v| sqrt(d).
    cancelled = 8 * 2.0 ** -23 * scale * math.sqrt(q.shape[-1]) * float(
        q.abs().max() * dout.abs().max() * v.abs().max()) if q.numel() and v.numel() else 0.0
    for name, g, w, t in zip(("dq", "dk", "dv"), got, want, theirs):
        assert g is not None, f"{what}{name}: no gradient"
        if w.numel() and w.abs().max() == 0:
            assert g.double().abs().max() <= cancelled, f"{what}{name}: {g.abs().max():.3g} where the gradient is 0"
            continue
        assert_flash_rule(g, w, t, q.dtype, f"{what}{name}", ATOL_EPS)


def grads_of(fn, inputs, dout):
    """Gradients of fn(*inputs) for the upstream gradient dout (inputs are leaves requiring grad)."""
    out = fn(*inputs)
    return torch.autograd.grad(out, inputs, dout)


def leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


@pytest.mark.parametrize("device,path", TARGETS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("dim", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims(monkeypatch, device, path, dtype, dim, causal):
    needs_kernel(device, dim)
    use_path(monkeypatch, path)
    seq = 71 if device == "cpu" else 257
    q, k, v = leaves(*make_qkv(2, seq, seq, 4, 2, dim, dtype, device))
    dout = torch.randn_like(q)
    scale = 1 / math.sqrt(dim)
    got = on_path(path, dim, grads_of, lambda *t: llmk.attention(*t, causal=causal), (q, k, v), dout)
    assert all(g.dtype == dtype and g.shape == t.shape for g, t in zip(got, (q, k, v)))
    assert_grads(got, q, k, v, dout, causal, scale)


@pytest.mark.parametrize("device,path", TARGETS)
@pytest.mark.parametrize("seqs", [(1, 1), (1, 333), (333, 1), (128, 128), (129, 257), (257, 129), (64, 700),
                                  (700, 64), (2, 3), (7, 127), (127, 7), (129, 0), (0, 129)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim,dtype", [(128, torch.bfloat16), (64, torch.float16)])
def test_sequence_lengths(monkeypatch, device, path, seqs, causal, dim, dtype):
    """Lengths around the tiles, batch 2, seq_q > seq_k (causal: rows that see no key, whose dq
    is exactly 0), no keys (dq = 0), no queries (dk = dv = 0)."""
    needs_kernel(device, dim)
    use_path(monkeypatch, path)
    seq_q, seq_k = seqs
    q, k, v = leaves(*make_qkv(2, seq_q, seq_k, 2, 1, dim, dtype, device))
    dout = torch.randn_like(q)
    got = on_path(path, dim, grads_of, lambda *t: llmk.attention(*t, causal=causal, scale=0.1), (q, k, v), dout)
    hidden = rows_without_keys(seq_q, seq_k, causal)
    assert torch.all(got[0][:, :hidden] == 0), "dq of rows that see no key"
    if seq_q == 0:
        assert torch.all(got[1] == 0) and torch.all(got[2] == 0), "dk, dv without queries"
    assert_grads(got, q, k, v, dout, causal, 0.1)


@pytest.mark.parametrize("device,path", TARGETS)
@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("dim", [64, 128])
def test_gqa_group_sizes(monkeypatch, device, path, group, dim):
    """dk and dv sum each kv head's query group."""
    needs_kernel(device, dim)
    use_path(monkeypatch, path)
    dtype = torch.float16 if group % 2 else torch.bfloat16
    for seq_q, seq_k, causal in ((150, 150, True), (100, 200, False)):
        q, k, v = leaves(*make_qkv(2, seq_q, seq_k, 2 * group, 2, dim, dtype, device))
        dout = torch.randn_like(q)
        got = on_path(path, dim, grads_of, lambda *t: llmk.attention(*t, causal=causal), (q, k, v), dout)
        assert_grads(got, q, k, v, dout, causal, 1 / math.sqrt(dim), what=f"group {group} {seq_q}x{seq_k} ")


@pytest.mark.parametrize("device,path", TARGETS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("dim", [64, 128])
def test_fused_qkv_and_transposed(monkeypatch, device, path, dtype, dim):
    """q, k, v as strided views of one projection (a leaf) with a spare head that no view covers:
    the projection's gradient is the three gradients in place and 0 in the spare head; in
    [B, S, H, D] and [B, H, S, D] storage. Then scaled_dot_product_attention's [B, H, S, D]."""
    needs_kernel(device, dim)
    use_path(monkeypatch, path)
    batch, seq, heads_q, heads_kv = 2, 190, 8, 2
    heads = heads_q + 2 * heads_kv + 1
    for transposed in (False, True):
        shape = (batch, heads, seq, dim) if transposed else (batch, seq, heads, dim)
        qkv = torch.randn(shape, dtype=dtype, device=device).requires_grad_()
        view = qkv.transpose(1, 2) if transposed else qkv
        q, k, v, _ = view.split([heads_q, heads_kv, heads_kv, 1], dim=2)
        dout = torch.randn(batch, seq, heads_q, dim, dtype=dtype, device=device)
        out = on_path(path, dim, llmk.attention, q, k, v, causal=True)
        out.backward(dout)
        grad = qkv.grad.transpose(1, 2) if transposed else qkv.grad
        got = grad.split([heads_q, heads_kv, heads_kv, 1], dim=2)
        assert torch.all(got[3] == 0), "the spare head's gradient"
        assert_grads(got[:3], q, k, v, dout, True, 1 / math.sqrt(dim), what=f"fused {'transposed ' * transposed}")
    q, k, v = leaves(*(t.transpose(1, 2) for t in make_qkv(2, 150, 150, 4, 2, dim, dtype, device)))  # [B, H, S, D]
    dout = torch.randn_like(q)
    got = on_path(path, dim, grads_of, lambda *t: llmk.scaled_dot_product_attention(*t, is_causal=True,
                                                                                   enable_gqa=True), (q, k, v), dout)
    assert_grads([g.transpose(1, 2) for g in got], *(t.transpose(1, 2) for t in (q, k, v, dout)), True,
                 1 / math.sqrt(dim), what="sdpa ")


@pytest.mark.parametrize("device,path", TARGETS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim", [64, 128])
@VARLEN_CASES
def test_varlen_matches_each_sequence(monkeypatch, device, path, causal, dim, lens):
    """The packed gradients, sequence by sequence, against each sequence's own gradients."""
    needs_kernel(device, dim)
    use_path(monkeypatch, path)
    lens_q, lens_k = lens
    if device == "cpu":
        lens_q, lens_k = [n // 3 + (n > 0) for n in lens_q], [n // 3 + (n > 0) for n in lens_k]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 4, 2, dim, torch.bfloat16, device)
    q, k, v = leaves(q, k, v)
    dout = torch.randn_like(q)
    got = on_path(path, dim, grads_of, lambda *t: llmk.attention_varlen(*t, cu_q, cu_k, max(lens_q), max(lens_k),
                                                                       causal=causal, scale=0.15), (q, k, v), dout)
    for b in range(len(lens_q)):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lens_q[b] == 0 and lens_k[b] == 0:
            continue
        assert_grads((got[0][None, sq], got[1][None, sk], got[2][None, sk]), q[None, sq], k[None, sk], v[None, sk],
                     dout[None, sq], causal, 0.15, what=f"sequence {b} ")


@requires_cuda
@pytest.mark.parametrize("path", ["sm80", "sm90", "auto"])
@pytest.mark.parametrize("dim", [64, 128, 256])
def test_deterministic_is_bitwise_repeatable(monkeypatch, path, dim):
    """deterministic=True (and torch.use_deterministic_algorithms) gives the same bytes in 10
    runs; both it and the default follow the rule."""
    needs_kernel("cuda", dim)
    use_path(monkeypatch, path)
    q, k, v = leaves(*make_qkv(2, 700, 700, 8, 2, dim, torch.bfloat16, "cuda"))
    dout = torch.randn_like(q)
    run = lambda det: on_path(path, dim, grads_of, lambda *t: llmk.attention(*t, causal=True, deterministic=det),
                              (q, k, v), dout)
    first = run(True)
    for _ in range(9):
        for a, b in zip(first, run(True)):
            assert torch.equal(a, b)
    assert_grads(first, q, k, v, dout, True, 1 / math.sqrt(dim), what="deterministic ")
    assert_grads(run(False), q, k, v, dout, True, 1 / math.sqrt(dim), what="default ")
    with _deterministic_mode():
        for a, b in zip(first, run(False)):
            assert torch.equal(a, b), "torch.use_deterministic_algorithms(True) takes the deterministic path"


class _deterministic_mode:
    """torch.use_deterministic_algorithms(True) for a block (warn_only: other ops may lack one)."""

    def __enter__(self):
        self.previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True, warn_only=True)

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.previous)


@pytest.mark.parametrize("device", DEVICES)
def test_lse_is_recomputed_for_a_direct_op_call(device):
    """torch.ops.llmk.attention with return_lse=False saves no lse; its backward recomputes it and
    gives the public function's gradients."""
    needs_kernel(device, 64)
    q, k, v = leaves(*make_qkv(1, 40, 50, 4, 2, 64, torch.bfloat16, device))
    dout = torch.randn_like(q)
    direct = grads_of(lambda *t: torch.ops.llmk.attention(*t, True, None, False)[0], (q, k, v), dout)
    public = grads_of(lambda *t: llmk.attention(*t, causal=True), (q, k, v), dout)
    for a, b in zip(direct, public):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_directional_derivative_cpu():
    """gradcheck-style on tiny shapes through the CPU path (GQA, causal with rows that see no key):
    the directional derivative of L = sum(dout * attention(q, k, v)) along random directions, by
    central differences of the float64 forward (h = 1e-5), against <grad L, u> from llmk's fp16
    gradients: within 1% of sum |u * grad| (their rounding is 2^-11 relative, plus the rounding
    of the forward's out they read)."""
    torch.manual_seed(torch.initial_seed() % 2**31)
    for (b, sq, sk, hq, hk, d), causal in [((1, 5, 7, 4, 2, 32), True), ((2, 6, 3, 2, 1, 32), True),
                                           ((1, 4, 4, 3, 1, 32), False)]:
        q, k, v = leaves(*make_qkv(b, sq, sk, hq, hk, d, torch.float16, "cpu"))
        dout = torch.randn_like(q)
        got = grads_of(lambda *t: llmk.attention(*t, causal=causal, scale=0.4), (q, k, v), dout)
        keep, _ = _mask(sq, sk, causal, "cpu")

        def loss(qd, kd, vd):
            s = torch.einsum("bqhd,bkhd->bhqk", qd, kd.repeat_interleave(hq // hk, 2)) * 0.4
            if keep is not None:
                s = s.masked_fill(~keep, float("-inf"))
            p = torch.softmax(s, -1).nan_to_num(0.0)
            return (torch.einsum("bhqk,bkhd->bqhd", p, vd.repeat_interleave(hq // hk, 2)) * dout.double()).sum()

        x = [t.detach().double() for t in (q, k, v)]
        for _ in range(4):
            u = [torch.randn_like(t) for t in x]
            h = 1e-5
            fd = (loss(*[a + h * e for a, e in zip(x, u)]) - loss(*[a - h * e for a, e in zip(x, u)])) / (2 * h)
            ours = sum((g.double() * e).sum() for g, e in zip(got, u))
            size = sum((g.double() * e).abs().sum() for g, e in zip(got, u))
            assert abs(ours - fd) <= 1e-2 * size + 1e-6, f"{(b, sq, sk, hq, hk, d)}: {ours.item()} vs {fd.item()}"


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_forward_and_backward(device):
    """torch.compile(fullgraph=True) of a loss over attention and attention_varlen: one forward
    graph, and AOTAutograd's backward graph with attention_backward / attention_varlen_backward,
    give eager's gradients."""
    needs_kernel(device, 64)
    q, k, v = make_qkv(1, 40, 50, 4, 2, 64, torch.bfloat16, device)
    cu = torch.tensor([0, 15, 40], dtype=torch.int32, device=device)

    def loss_of(q, k, v):
        out = llmk.attention(q * 2, k, v, causal=True)
        packed = llmk.attention_varlen(q[0], k[0, :40], v[0, :40], cu, cu, 25, 25, causal=True)
        return out.float().square().sum() + packed.float().sum()

    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(loss_of, fullgraph=True, backend=backend)
    got, want = leaves(q, k, v), leaves(q, k, v)
    compiled(*got).backward()
    loss_of(*want).backward()
    for g, w in zip(got, want):
        torch.testing.assert_close(g.grad, w.grad)


class TinyAttentionModel(torch.nn.Module):
    """Embedding, one causal self-attention block (fp32 weights, bf16 attention), logits."""

    def __init__(self, attend, vocab=48, dim=128, heads=2, kv_heads=1):
        super().__init__()
        self.attend, self.heads, self.kv_heads, self.head_dim = attend, heads, kv_heads, dim // heads
        self.embed = torch.nn.Embedding(vocab, dim)
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        b, s, _ = x.shape
        q, k, v = self.qkv(x).to(torch.bfloat16).view(b, s, -1, self.head_dim).split(
            [self.heads, self.kv_heads, self.kv_heads], dim=2)
        y = self.attend(q, k, v).float().reshape(b, s, -1)
        return self.head(x + self.proj(y))


def _sdpa_attend(q, k, v):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                          enable_gqa=True).transpose(1, 2)


@pytest.mark.parametrize("device", DEVICES)
def test_training_matches_pytorch(device):
    """Eight AdamW steps of a tiny attention model on llmk.attention and on PyTorch's SDPA from the
    same weights and batches: the loss curves agree (bf16 attention on both; the curves drift
    apart by rounding only) and the loss goes down."""
    needs_kernel(device, 64)
    torch.manual_seed(1234)
    ours = TinyAttentionModel(lambda q, k, v: llmk.attention(q, k, v, causal=True)).to(device)
    theirs = TinyAttentionModel(_sdpa_attend).to(device)
    theirs.load_state_dict(ours.state_dict())
    opts = [torch.optim.AdamW(m.parameters(), lr=3e-3) for m in (ours, theirs)]
    data = torch.randint(0, 48, (8, 4, 65), device=device)
    curves = ([], [])
    for tokens in data:
        for model, opt, curve in zip((ours, theirs), opts, curves):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            curve.append(loss.item())
    for step, (a, b) in enumerate(zip(*curves)):
        assert abs(a - b) <= 2e-2 * abs(b), f"step {step}: llmk loss {a:.5f}, PyTorch {b:.5f}"
    assert curves[0][-1] < curves[0][0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [64, 96])
def test_outputs_are_fully_written(device, dim):
    """Gradients allocated over NaN: every element is written (on the GPU the caching allocator
    hands the op poisoned blocks)."""
    needs_kernel(device, dim)
    q, k, v = leaves(*make_qkv(2, 77, 90, 4, 4, dim, torch.float16, device))
    dout = torch.randn_like(q)
    poison_allocator(q)
    for deterministic in (False, True):
        got = grads_of(lambda *t: llmk.attention(*t, causal=True, deterministic=deterministic), (q, k, v), dout)
        assert not any(g.isnan().any() for g in got)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    needs_kernel(device, 64)
    q, k, v = make_qkv(1, 8, 8, 4, 2, 64, torch.bfloat16, device)
    out, lse = llmk.attention(q, k, v, causal=True, return_lse=True)
    dout = torch.randn_like(out)
    with pytest.raises(RuntimeError, match=r"attention_backward: lse must be float32 \[batch, heads_q, seq_q\]"):
        llmk.attention_backward(dout, q, k, v, out, lse[:, :, :7], True)
    with pytest.raises(RuntimeError, match="attention_backward: dout has shape"):
        llmk.attention_backward(dout[:, :7], q, k, v, out, lse, True)
    with pytest.raises(RuntimeError, match="attention_backward: out has dtype float16, expected bfloat16"):
        llmk.attention_backward(dout, q, k, v, out.half(), lse, True)
    with pytest.raises(RuntimeError, match="attention_backward: lse has dtype float16, expected float32"):
        llmk.attention_backward(dout, q, k, v, out, lse.half(), True)
    with pytest.raises(RuntimeError, match="scale must be finite and > 0"):
        llmk.attention_backward(dout, q, k, v, out, lse, True, float("nan"))
    pq, pk, pv, cu_q, cu_k = _packed([3, 5], [4, 4], 2, 2, 64, torch.bfloat16, device)
    pout, plse = llmk.attention_varlen(pq, pk, pv, cu_q, cu_k, 5, 4, return_lse=True)
    with pytest.raises(RuntimeError, match="cannot hold"):
        llmk.attention_varlen_backward(torch.randn_like(pout), pq, pk, pv, pout, plse, cu_q, cu_k, 3, 4)
    with pytest.raises(RuntimeError, match="lse must be float32 \\[heads_q, total_q\\]"):
        llmk.attention_varlen_backward(torch.randn_like(pout), pq, pk, pv, pout, plse[:, :7], cu_q, cu_k, 5, 4)
