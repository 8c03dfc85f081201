"""torch.ops.llmk.rope_ (in place on q and k) and llmk.rope / llmk.rope_backward (out of
place, autograd): values against a float64 definition on CPU and CUDA for both styles,
cache and theta angles, partial rotary (the out-of-place tail copied), GQA, fused-qkv
slices, [batch, seq, ...] and [batch, heads, seq, ...] layouts, int32/int64 positions,
inputs left untouched, gradients in any layout, Llama 3.1 scaling against Hugging Face's
formula, out-of-range positions, torch.compile(fullgraph=True), bad inputs."""

import math

import pytest
import torch

import llmk
from conftest import DEVICES, DTYPES, HAS_CUDA, RTOL, assert_close, poison_allocator

LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def inv_freq_ref(rot_dim, theta, llama3=None):
    """Hugging Face's default and llama3 inverse frequencies, in float64."""
    inv = 1.0 / theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    if llama3 is None:
        return inv
    old, low, high, factor = (llama3["original_max_position_embeddings"], llama3["low_freq_factor"],
                              llama3["high_freq_factor"], llama3["factor"])
    wavelen = 2 * math.pi / inv
    out = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return torch.where(medium, smoothed, out)


def rope_ref(x, positions, inv_freq, style, rot_dim, inverse=False):
    """x: [..., heads, dim] with positions of x's leading dims (broadcast); float64 result."""
    x = x.double().cpu()
    angle = positions.double().cpu()[..., None, None] * inv_freq  # [..., 1, rot/2]
    cos, sin = angle.cos(), angle.sin() * (-1 if inverse else 1)
    out = x.clone()
    if style == "neox":
        x1, x2 = x[..., : rot_dim // 2], x[..., rot_dim // 2: rot_dim]
        out[..., : rot_dim // 2] = x1 * cos - x2 * sin
        out[..., rot_dim // 2: rot_dim] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., 0:rot_dim:2], x[..., 1:rot_dim:2]
        out[..., 0:rot_dim:2] = x1 * cos - x2 * sin
        out[..., 1:rot_dim:2] = x2 * cos + x1 * sin
    return out


def check(got, want, dtype):
    # One rounding of terms of the inputs' size: atol relative to the largest input.
    assert_close(got, want, RTOL[dtype], atol=2e-5 + RTOL[dtype] * 1e-3 * want.abs().max().item())


LAYOUTS = ["tokens", "qkv", "bshd", "bhsd"]


def make_qk(layout, device, dtype, heads_q, heads_k, dim, batch=2, seq=13):
    """q, k and the tensor they live in (to check untouched parts), plus positions."""
    if layout == "tokens":
        q = torch.randn(batch * seq, heads_q, dim, device=device, dtype=dtype)
        k = torch.randn(batch * seq, heads_k, dim, device=device, dtype=dtype)
        return q, k, None, torch.randint(0, 4096, (batch * seq,), device=device)
    if layout == "qkv":  # one projection output [tokens, (hq + 2 hk) * dim], q and k are views
        qkv = torch.randn(batch * seq, (heads_q + 2 * heads_k) * dim, device=device, dtype=dtype)
        q = qkv[:, : heads_q * dim].view(-1, heads_q, dim)
        k = qkv[:, heads_q * dim: (heads_q + heads_k) * dim].view(-1, heads_k, dim)
        return q, k, qkv, torch.randint(0, 4096, (batch * seq,), device=device, dtype=torch.int32)
    if layout == "bshd":
        q = torch.randn(batch, seq, heads_q, dim, device=device, dtype=dtype)
        k = torch.randn(batch, seq, heads_k, dim, device=device, dtype=dtype)
        return q, k, None, torch.randint(0, 4096, (batch, seq), device=device)
    # bhsd: Hugging Face's [batch, heads, seq, dim] seen as [batch, seq, heads, dim]
    q = torch.randn(batch, heads_q, seq, dim, device=device, dtype=dtype).transpose(1, 2)
    k = torch.randn(batch, heads_k, seq, dim, device=device, dtype=dtype).transpose(1, 2)
    return q, k, None, torch.arange(seq, device=device)[None] + 5  # [1, seq], shared by the batch


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("source", ["cache", "theta"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_matches_definition(device, dtype, style, source, layout):
    heads_q, heads_k, dim, rot = (8, 2, 128, 128) if layout != "bshd" else (5, 3, 80, 64)
    q, k, base, positions = make_qk(layout, device, dtype, heads_q, heads_k, dim)
    inv = inv_freq_ref(rot, 10000.0)
    want_q = rope_ref(q, positions, inv, style, rot)
    want_k = rope_ref(k, positions, inv, style, rot)
    before = base.clone() if base is not None else None
    cache = llmk.rope_cos_sin_cache(4096 + 32, rot, 10000.0, device=device) if source == "cache" else None
    llmk.rope_(q, k, positions, cache, rot_dim=rot, style=style)
    check(q, want_q, dtype)
    check(k, want_k, dtype)
    if base is not None:  # the v heads are untouched
        v_start = (heads_q + heads_k) * dim
        assert torch.equal(base[:, v_start:], before[:, v_start:])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("source", ["cache", "theta"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("partial", [False, True])
def test_out_of_place_matches_definition(device, dtype, style, source, layout, partial):
    """llmk.rope and llmk.rope_backward write new contiguous tensors in one pass: the rotated
    part against float64, the tail past rot_dim copied bit for bit, the inputs untouched."""
    heads_q, heads_k, dim = (8, 2, 128) if layout != "bshd" else (5, 3, 80)
    rot = (32 if layout != "bshd" else 48) if partial else dim
    q, k, base, positions = make_qk(layout, device, dtype, heads_q, heads_k, dim)
    positions = positions.to(torch.int32 if style == "gptj" else torch.int64)
    inv = inv_freq_ref(rot, 10000.0)
    cache = llmk.rope_cos_sin_cache(4096 + 32, rot, 10000.0, device=device) if source == "cache" else None
    q0, k0 = q.clone(), k.clone()
    base0 = base.clone() if base is not None else None
    for backward in (False, True):
        poison_allocator(q)  # on the GPU the outputs start as NaN: an unwritten element fails
        op = llmk.rope_backward if backward else llmk.rope
        q_out, k_out = op(q, k, positions, cache, rot_dim=rot, style=style)
        for got, x in ((q_out, q), (k_out, k)):
            assert got.shape == x.shape and got.dtype == x.dtype and got.is_contiguous()
            check(got, rope_ref(x, positions, inv, style, rot, inverse=backward), dtype)
            assert torch.equal(got[..., rot:], x[..., rot:])
        assert torch.equal(q, q0) and torch.equal(k, k0)
        if base is not None:
            assert torch.equal(base, base0)


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_place_reads_any_input_layout(device):
    """Inputs are only read: gradients arrive expanded (stride 0) or with a strided last dim,
    and q and k may be the same tensor."""
    positions = torch.randint(0, 1000, (7,), device=device)
    inv = inv_freq_ref(64, 1e4)
    dq_expanded = torch.randn(7, 1, 64, device=device).expand(7, 4, 64)
    dk_strided = torch.randn(7, 64, 2, device=device).transpose(1, 2)  # last dim stride 2
    poison_allocator(dq_expanded)
    dq, dk = llmk.rope_backward(dq_expanded, dk_strided, positions)
    check(dq, rope_ref(dq_expanded, positions, inv, "neox", 64, inverse=True), torch.float32)
    check(dk, rope_ref(dk_strided, positions, inv, "neox", 64, inverse=True), torch.float32)
    q = torch.randn(7, 3, 64, device=device)
    q_out, k_out = llmk.rope(q, q, positions, style="gptj")
    want = rope_ref(q, positions, inv, "gptj", 64)
    check(q_out, want, torch.float32)
    assert torch.equal(q_out, k_out)


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_place_bad_inputs(device):
    q = torch.randn(6, 2, 64, device=device)
    k = torch.randn(6, 1, 64, device=device)
    positions = torch.arange(6, device=device)
    q0, k0 = q.clone(), k.clone()
    with pytest.raises(RuntimeError, match=r"rope: positions must have q's leading dims \(\[tokens\] = \[6\]\)"):
        llmk.rope(q, k, positions[:5])
    with pytest.raises(RuntimeError, match="rope: k has dtype float16, expected float32"):
        llmk.rope(q, k.half(), positions)
    with pytest.raises(RuntimeError, match="rope_backward: dk must have dq's leading"):
        llmk.rope_backward(q, k[:5], positions)
    with pytest.raises(RuntimeError, match="rope: rot_dim must be even"):
        llmk.rope(q, k, positions, rot_dim=31)
    if HAS_CUDA and device == "cuda":
        with pytest.raises(RuntimeError, match="rope: positions is on cpu:0 but q is on cuda:0"):
            llmk.rope(q, k, positions.cpu())
    assert torch.equal(q, q0) and torch.equal(k, k0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_llama3_scaling_and_large_positions(device, style):
    q = torch.randn(6, 4, 128, device=device)
    positions = torch.tensor([0, 1, 8191, 8192, 65536, 131071], device=device)
    inv = inv_freq_ref(128, 500000.0, LLAMA3)
    want = rope_ref(q, positions, inv, style, 128)
    out, _ = llmk.rope(q, None, positions, theta=500000.0, style=style, llama3_scaling=LLAMA3)
    assert_close(out, want, 2e-5, atol=2e-5)
    cache = llmk.rope_cos_sin_cache(131072, 128, 500000.0, LLAMA3, device=device)
    out_cache, _ = llmk.rope(q, None, positions, cache, style=style)
    assert_close(out_cache, want, 2e-5, atol=2e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_partial_rotary_keeps_tail_and_inverse_restores(device, dtype):
    q = torch.randn(9, 3, 96, device=device, dtype=dtype)
    k = torch.randn(9, 1, 96, device=device, dtype=dtype)
    positions = torch.randint(0, 100000, (9,), device=device)
    q0, k0 = q.clone(), k.clone()
    llmk.rope_(q, k, positions, rot_dim=32, style="gptj")
    assert torch.equal(q[..., 32:], q0[..., 32:]) and torch.equal(k[..., 32:], k0[..., 32:])
    check(q, rope_ref(q0, positions, inv_freq_ref(32, 1e4), "gptj", 32), dtype)
    llmk.rope_backward_(q, k, positions, rot_dim=32, style="gptj")
    # Two roundings, each of a pair's magnitude: an absolute tolerance of the inputs' scale.
    assert_close(q, q0, RTOL[dtype], atol=RTOL[dtype] * q0.abs().max().item())
    assert_close(k, k0, RTOL[dtype], atol=RTOL[dtype] * k0.abs().max().item())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_autograd_matches_float64(device, dtype):
    q = torch.randn(2, 7, 4, 64, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 7, 2, 64, device=device, dtype=dtype, requires_grad=True)
    positions = torch.randint(0, 1000, (2, 7), device=device)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    qo, ko = llmk.rope(q, k, positions, rot_dim=48)
    torch.autograd.backward([qo, ko], [dq, dk])
    inv = inv_freq_ref(48, 1e4)
    q64, k64 = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    torch.autograd.backward([rope_ref(q64, positions, inv, "neox", 48), rope_ref(k64, positions, inv, "neox", 48)],
                            [dq.double().cpu(), dk.double().cpu()])
    check(q.grad, q64.grad, dtype)
    check(k.grad, k64.grad, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    backend = "inductor" if device == "cuda" else "aot_eager"

    def attention_inputs(qkv, positions):
        q = qkv[:, :256].view(-1, 4, 64)
        k = qkv[:, 256:384].view(-1, 2, 64)
        qo, ko = llmk.rope(q, k, positions, style="gptj")
        return (qo.square().sum() + 2 * ko.square().sum() + (qo[:, 0] * ko[:, 1]).sum())

    qkv = torch.randn(11, 512, device=device, requires_grad=True)
    positions = torch.randint(0, 500, (11,), device=device)
    out = torch.compile(attention_inputs, fullgraph=True, backend=backend)(qkv, positions)
    out.backward()
    qkv64 = qkv.detach().double().cpu().requires_grad_()
    inv = inv_freq_ref(64, 1e4)
    q = rope_ref(qkv64[:, :256].view(-1, 4, 64), positions, inv, "gptj", 64)
    k = rope_ref(qkv64[:, 256:384].view(-1, 2, 64), positions, inv, "gptj", 64)
    want = q.square().sum() + 2 * k.square().sum() + (q[:, 0] * k[:, 1]).sum()
    want.backward()
    assert_close(out.detach().reshape(1), want.detach().reshape(1), 1e-4)
    assert_close(qkv.grad, qkv64.grad, 1e-4, "dqkv", atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_range_positions(device):
    q = torch.randn(4, 2, 16, device=device)
    cache = llmk.rope_cos_sin_cache(8, 16, device=device)
    positions = torch.tensor([0, 8, -1, 7], device=device)
    if device == "cpu":
        before = q.clone()
        with pytest.raises(RuntimeError, match=r"position 8 \(index 1\) is outside the cos_sin_cache's 8 rows"):
            llmk.rope_(q, None, positions, cache)
        assert torch.equal(q, before)
    else:  # documented: the token's rotated elements become NaN, nothing is read past the cache
        llmk.rope_(q, None, positions, cache)
        assert torch.isnan(q[1:3]).all() and not torch.isnan(q[0]).any() and not torch.isnan(q[3]).any()


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    qkv = torch.randn(6, 3 * 64, device=device)
    q, k = qkv[:, :128].view(6, 2, 64), qkv[:, 128:].view(6, 1, 64)
    positions = torch.arange(6, device=device)
    before = qkv.clone()
    with pytest.raises(RuntimeError, match="rope_: rot_dim must be even"):
        llmk.rope_(q, k, positions, rot_dim=33)
    with pytest.raises(RuntimeError, match="rope_: q and k overlap"):
        llmk.rope_(q, qkv[:, 64:128].view(6, 1, 64), positions)
    with pytest.raises(RuntimeError, match="rope_: positions must be int32 or int64"):
        llmk.rope_(q, k, positions.float())
    with pytest.raises(RuntimeError, match=r"rope_: positions must have q's leading dims \(\[tokens\] = \[6\]\), got \[5\]"):
        llmk.rope_(q, k, positions[:5])
    with pytest.raises(RuntimeError, match="rope_: style must be 'neox' or 'gptj'"):
        llmk.rope_(q, k, positions, style="llama")
    with pytest.raises(ValueError, match="rope_: llama3_scaling lacks"):
        llmk.rope_(q, k, positions, llama3_scaling={"factor": 8.0})
    with pytest.raises(RuntimeError, match="rope_: cos_sin_cache has dtype float16, expected float32"):
        llmk.rope_(q, k, positions, llmk.rope_cos_sin_cache(8, 64, device=device).half())
    with pytest.raises(RuntimeError, match="rope_: k has dtype float16, expected float32"):
        llmk.rope_(q, k.half(), positions)
    if HAS_CUDA and device == "cuda":
        with pytest.raises(RuntimeError, match="rope_: positions is on cpu:0 but q is on cuda:0"):
            llmk.rope_(q, k, positions.cpu())
    assert torch.equal(qkv, before)
    empty = torch.randn(0, 2, 64, device=device)
    llmk.rope_(empty, None, positions[:0])
    assert llmk.rope(empty, None, positions[:0])[0].shape == (0, 2, 64)
