"""llmk.attention / attention_varlen / scaled_dot_product_attention: the CPU backend and the
CUDA kernel against a float64 reference with the FlashAttention error rule (our max error at
most 2x that of PyTorch's own attention in the same dtype against the same reference, plus a
small atol), over head dims, causal masks (bottom-right when seq_q != seq_k, fully masked
rows), GQA/MQA, lengths that are not multiples of the tiles, strided and transposed layouts,
lse, packed variable-length batches; poisoned outputs, opcheck, torch.compile, bad inputs. The
backward: test_attention_backward.py.

The CUDA cases run on each forward path, LLMK_ATTENTION_PATH = sm80 (the mma.sync kernel),
sm90 (the Hopper TMA + wgmma kernel) and auto, which the library reads on every call. A forced
sm90 that declines a call ("cannot take this call") skips the case with the reason, unless the
Hopper kernel must take it (an sm_90 device, an sm_90a build, head dim 64, 128 or 256 as far as
LLMK_HEAD_DIMS builds them, and a reason that does not blame "this build"): then it fails."""

import math

import pytest
import torch
import torch.nn.functional as F

import llmk
from conftest import DEVICES, poison_allocator, requires_cuda

HALF_DTYPES = [torch.float16, torch.bfloat16]
ATOL = 2**-10  # the rule's small absolute slack (outputs are O(0.1-1))
PATHS = ["sm80", "sm90", "auto"]
# (device, LLMK_ATTENTION_PATH): the CPU backend once, the CUDA kernel on each forward path.
TARGETS = [pytest.param("cpu", None, id="cpu")] + [
    pytest.param("cuda", path, id=f"cuda-{path}", marks=requires_cuda) for path in PATHS]


def use_path(monkeypatch, path):
    """Sets LLMK_ATTENTION_PATH for this test (monkeypatch restores it); None leaves it alone."""
    if path is not None:
        monkeypatch.setenv("LLMK_ATTENTION_PATH", path)


def sm90_must_take(dim):
    """Whether the Hopper kernels must take a call of head dim `dim` on this device (every call of
    these tests is fp16/bf16 with 16-byte aligned strides and data): head dims 64, 96, 128 and 256,
    forward and backward."""
    return (torch.cuda.get_device_capability() == (9, 0) and "90a" in llmk._C.build_cuda_archs().split(";")
            and dim in (64, 96, 128, 256) and llmk._C.attention_head_dim_compiled(dim))


def on_path(path, dim, fn, *args, **kwargs):
    """fn(*args, **kwargs) under the test's path; an sm90 decline that is allowed skips the test
    with the reason, one that is not fails it."""
    try:
        return fn(*args, **kwargs)
    except RuntimeError as e:
        msg = str(e)
        if path != "sm90" or "cannot take this call" not in msg:
            raise
        if sm90_must_take(dim) and "this build" not in msg:
            pytest.fail(f"LLMK_ATTENTION_PATH=sm90 declined a call the Hopper kernel must take: {msg}")
        pytest.skip(f"note: {msg}")


def attention_ref(q, k, v, causal, scale):
    """float64 attention over [batch, seq, heads, dim]; bottom-right causal mask; rows that see
    no key give 0 and lse -inf. Returns (out [B, Sq, H, D], lse [B, H, Sq])."""
    heads_q, heads_kv = q.shape[2], k.shape[2]
    qd = q.double().transpose(1, 2)
    kd = k.double().repeat_interleave(heads_q // heads_kv, dim=2).transpose(1, 2)
    vd = v.double().repeat_interleave(heads_q // heads_kv, dim=2).transpose(1, 2)
    s = qd @ kd.transpose(-1, -2) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return (p @ vd).transpose(1, 2), lse


def torch_attention(q, k, v, causal, scale):
    """PyTorch's own attention in q's dtype (SDPA, default backend), the FA rule's yardstick."""
    group = q.shape[2] // k.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)))
    sq, sk = q.shape[1], k.shape[1]
    mask = None
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        mask = torch.arange(sk, device=q.device)[None, :] <= i + sk - sq
    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale).transpose(1, 2).nan_to_num(0.0)


def assert_fa_rule(out, q, k, v, causal, scale, what="out"):
    ref, _ = attention_ref(q, k, v, causal, scale)
    ours = (out.double() - ref).abs().max().item()
    theirs = (torch_attention(q, k, v, causal, scale).double() - ref).abs().max().item()
    assert ours <= 2 * theirs + ATOL, f"{what}: max error {ours:.3g} > 2 x PyTorch's {theirs:.3g} + {ATOL:.3g}"


def needs_kernel(device, *dims):
    """Skips a CUDA test of a head dim that this build (CMake's LLMK_HEAD_DIMS) has no kernel for."""
    for dim in dims:
        if device == "cuda" and not llmk._C.attention_head_dim_compiled(dim):
            pytest.skip(f"head_dim {dim} not in this build's LLMK_HEAD_DIMS")


def rows_without_keys(seq_q, seq_k, causal):
    """The leading query rows that see no key: all of them without keys, seq_q - seq_k when a
    causal mask (aligned bottom-right) starts past the first rows."""
    return seq_q if seq_k == 0 else seq_q - seq_k if causal and seq_q > seq_k else 0


def make_qkv(batch, seq_q, seq_k, heads_q, heads_kv, dim, dtype, device):
    q = torch.randn(batch, seq_q, heads_q, dim, dtype=dtype, device=device)
    k = torch.randn(batch, seq_k, heads_kv, dim, dtype=dtype, device=device)
    v = torch.randn(batch, seq_k, heads_kv, dim, dtype=dtype, device=device)
    return q, k, v


@pytest.mark.parametrize("device,path", TARGETS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("dim", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims(monkeypatch, device, path, dtype, dim, causal):
    needs_kernel(device, dim)
    use_path(monkeypatch, path)
    seq = 131 if device == "cpu" else 257
    q, k, v = make_qkv(2, seq, seq, 4, 2, dim, dtype, device)
    scale = 1 / math.sqrt(dim)
    out, lse = on_path(path, dim, llmk.attention, q, k, v, causal=causal, return_lse=True)
    assert out.dtype == dtype and out.shape == q.shape and lse.shape == (2, 4, seq)
    assert_fa_rule(out, q, k, v, causal, scale)
    _, lse_ref = attention_ref(q, k, v, causal, scale)
    torch.testing.assert_close(lse.double(), lse_ref, rtol=1e-5, atol=1e-4)
    # lse is optional: the call without it computes the same out.
    assert_fa_rule(on_path(path, dim, llmk.attention, q, k, v, causal=causal), q, k, v, causal, scale,
                   what="out without lse")


@pytest.mark.parametrize("device,path", TARGETS)
@pytest.mark.parametrize("seqs", [(1, 1), (1, 333), (333, 1), (128, 128), (129, 257), (257, 129), (64, 1100),
                                  (1100, 64), (2, 3), (7, 127), (127, 7), (1, 129), (129, 1000), (1000, 129),
                                  (1000, 1000), (129, 0)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim,dtype", [(128, torch.bfloat16), (64, torch.float16)])
def test_sequence_lengths(monkeypatch, device, path, seqs, causal, dim, dtype):
    """Lengths around the 128-row tiles, batch 2 (a tile that crosses the end of a sequence must
    not see the next batch entry's rows), seq_q > seq_k (causal: rows that see no key), no keys."""
    needs_kernel(device, dim)
    use_path(monkeypatch, path)
    seq_q, seq_k = seqs
    q, k, v = make_qkv(2, seq_q, seq_k, 2, 1, dim, dtype, device)
    out, lse = on_path(path, dim, llmk.attention, q, k, v, causal=causal, scale=0.1, return_lse=True)
    hidden = rows_without_keys(seq_q, seq_k, causal)
    if hidden:  # the rows that see no key: exactly 0, lse -inf
        assert torch.all(out[:, :hidden] == 0) and torch.all(lse[:, :, :hidden] == float("-inf"))
    if seq_k == 0:
        return
    assert_fa_rule(out, q, k, v, causal, 0.1)
    _, lse_ref = attention_ref(q, k, v, causal, 0.1)
    torch.testing.assert_close(lse.double(), lse_ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("device,path", TARGETS)
@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("dim", [64, 128])
def test_gqa_group_sizes(monkeypatch, device, path, group, dim):
    needs_kernel(device, dim)
    use_path(monkeypatch, path)
    dtype = torch.float16 if group % 2 else torch.bfloat16
    for seq_q, seq_k, causal in ((150, 150, True), (100, 200, False)):
        q, k, v = make_qkv(2, seq_q, seq_k, 2 * group, 2, dim, dtype, device)
        out = on_path(path, dim, llmk.attention, q, k, v, causal=causal)
        assert_fa_rule(out, q, k, v, causal, 1 / math.sqrt(dim), what=f"group {group} {seq_q}x{seq_k}")


@pytest.mark.parametrize("device,path", TARGETS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("dim", [64, 128])
def test_gqa_mqa_and_fused_qkv(monkeypatch, device, path, dtype, dim):
    """q, k, v as strided views of one projection whose spare head is NaN (a kernel that reads past
    v's heads is caught), in [B, S, H, D] and in [B, H, S, D] storage; MQA."""
    needs_kernel(device, dim)
    use_path(monkeypatch, path)
    batch, seq, heads_q, heads_kv = 2, 190, 8, 2
    heads = heads_q + 2 * heads_kv + 1
    for transposed in (False, True):
        shape = (batch, heads, seq, dim) if transposed else (batch, seq, heads, dim)
        qkv = torch.randn(shape, dtype=dtype, device=device)
        qkv = qkv.transpose(1, 2) if transposed else qkv
        qkv[:, :, -1] = float("nan")
        q, k, v, _ = qkv.split([heads_q, heads_kv, heads_kv, 1], dim=2)  # strided views of one projection
        out = on_path(path, dim, llmk.attention, q, k, v, causal=True)
        assert_fa_rule(out, q, k, v, True, 1 / math.sqrt(dim), what=f"fused qkv{' transposed' if transposed else ''}")
    q, k, v = make_qkv(3, 77, 77, 8, 1, dim, dtype, device)  # MQA
    assert_fa_rule(on_path(path, dim, llmk.attention, q, k, v, causal=True), q, k, v, True, 1 / math.sqrt(dim))


@pytest.mark.parametrize("device,path", TARGETS)
@pytest.mark.parametrize("dim", [64, 128])
def test_scaled_dot_product_attention_matches_pytorch(monkeypatch, device, path, dim):
    needs_kernel(device, dim)
    use_path(monkeypatch, path)
    q = torch.randn(2, 4, 150, dim, dtype=torch.bfloat16, device=device)  # [B, H, S, D]
    k = torch.randn(2, 2, 150, dim, dtype=torch.bfloat16, device=device)
    v = torch.randn(2, 2, 150, dim, dtype=torch.bfloat16, device=device)
    for causal in (False, True):
        out = on_path(path, dim, llmk.scaled_dot_product_attention, q, k, v, is_causal=causal, enable_gqa=True)
        assert out.shape == q.shape
        assert_fa_rule(out.transpose(1, 2), q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal,
                       1 / math.sqrt(dim))
    with pytest.raises(ValueError, match="enable_gqa"):
        llmk.scaled_dot_product_attention(q, k, v)
    with pytest.raises(ValueError, match="attn_mask"):
        llmk.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(150, 150, dtype=torch.bool, device=device))
    with pytest.raises(ValueError, match="top-left"):
        llmk.scaled_dot_product_attention(q[:, :, :10], q, q, is_causal=True)


def _packed(lens_q, lens_k, heads_q, heads_kv, dim, dtype, device):
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device=device)
    q = torch.randn(sum(lens_q), heads_q, dim, dtype=dtype, device=device)
    k = torch.randn(sum(lens_k), heads_kv, dim, dtype=dtype, device=device)
    v = torch.randn(sum(lens_k), heads_kv, dim, dtype=dtype, device=device)
    return q, k, v, cu_q, cu_k


# (q lengths, k lengths) of packed batches, for the forward's and the backward's varlen tests.
VARLEN_CASES = pytest.mark.parametrize("lens", [([1, 130, 0, 77, 300, 40], [1, 130, 5, 200, 250, 0]),
                                                ([0, 7, 129, 0, 300, 1], [5, 7, 200, 0, 127, 0]),  # empty, no keys
                                                ([7, 129], [0, 0])],  # no keys at all
                                       ids=["mixed", "empty", "no_keys"])


@pytest.mark.parametrize("device,path", TARGETS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim", [64, 128])
@VARLEN_CASES
def test_varlen_matches_each_sequence(monkeypatch, device, path, causal, dim, lens):
    needs_kernel(device, dim)
    use_path(monkeypatch, path)
    lens_q, lens_k = lens
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 4, 2, dim, torch.bfloat16, device)
    out, lse = on_path(path, dim, llmk.attention_varlen, q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                       causal=causal, scale=0.15, return_lse=True)
    assert lse.shape == (4, sum(lens_q))
    for b in range(len(lens_q)):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lens_q[b] == 0:
            continue
        if lens_k[b] == 0:  # every row sees no key
            assert torch.all(out[sq] == 0) and torch.all(lse[:, sq] == float("-inf")), f"sequence {b}"
            continue
        qb, kb, vb = q[None, sq], k[None, sk], v[None, sk]
        assert_fa_rule(out[None, sq], qb, kb, vb, causal, 0.15, what=f"sequence {b}")
        _, lse_ref = attention_ref(qb, kb, vb, causal, 0.15)
        torch.testing.assert_close(lse[:, sq].double(), lse_ref[0], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    needs_kernel(device, 64)
    q, k, v = make_qkv(1, 40, 50, 2, 1, 64, torch.bfloat16, device)

    def block(q, k, v):
        return llmk.attention(q * 2, k, v, causal=True).sum(-1)

    backend = "inductor" if device == "cuda" else "aot_eager"
    got = torch.compile(block, fullgraph=True, backend=backend)(q, k, v)
    torch.testing.assert_close(got, block(q, k, v))


@pytest.mark.parametrize("device,path", TARGETS)
@pytest.mark.parametrize("dim", [96, 128])
def test_outputs_are_fully_written(monkeypatch, device, path, dim):
    """Outputs allocated over NaN: every element of out and lse is written (on the GPU the
    caching allocator hands the op the poisoned block; the C++ tests poison CPU outputs)."""
    needs_kernel(device, dim)
    use_path(monkeypatch, path)
    q, k, v = make_qkv(2, 77, 90, 4, 4, dim, torch.float16, device)
    poison_allocator(q)
    out, lse = on_path(path, dim, llmk.attention, q, k, v, causal=True, scale=0.1, return_lse=True)
    assert not out.isnan().any() and not lse.isnan().any()
    assert_fa_rule(out, q, k, v, True, 0.1)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    needs_kernel(device, 64)
    q, k, v = make_qkv(1, 8, 8, 4, 2, 64, torch.bfloat16, device)
    with pytest.raises(RuntimeError, match=r"heads_q \(4\) must be a multiple of heads_kv \(3\)"):
        llmk.attention(q, k.repeat(1, 1, 2, 1)[:, :, :3], v.repeat(1, 1, 2, 1)[:, :, :3])
    with pytest.raises(RuntimeError, match="supported head dims are 32, 64, 96, 128 and 256"):
        llmk.attention(q[..., :48], k[..., :48], v[..., :48])
    with pytest.raises(RuntimeError, match="k and v have head_dim 32, q has 64"):
        llmk.attention(q, k[..., :32], v[..., :32])
    with pytest.raises(RuntimeError, match="k has dtype float16, expected bfloat16"):
        llmk.attention(q, k.half(), v)
    with pytest.raises(RuntimeError, match="must be float16 or bfloat16, got float32"):
        llmk.attention(q.float(), k.float(), v.float())
    with pytest.raises(RuntimeError, match="contiguous in its last"):
        llmk.attention(torch.randn(1, 8, 4, 128, dtype=torch.bfloat16, device=device)[..., ::2], k, v)
    with pytest.raises(RuntimeError, match="scale must be finite and > 0"):
        llmk.attention(q, k, v, scale=float("inf"))
    qkv = torch.randn(2, 8, 8, 4 * 64 + 8, dtype=torch.bfloat16, device=device)[..., 4:4 + 64]
    with pytest.raises(RuntimeError, match="not 16-byte aligned"):
        llmk.attention(qkv, k, v)
    pq, pk, pv, cu_q, cu_k = _packed([3, 5], [4, 4], 2, 2, 64, torch.bfloat16, device)
    with pytest.raises(RuntimeError, match="cu_seqlens_q has dtype int64, expected int32"):
        llmk.attention_varlen(pq, pk, pv, cu_q.long(), cu_k, 5, 4)
    with pytest.raises(RuntimeError, match="cannot hold"):
        llmk.attention_varlen(pq, pk, pv, cu_q, cu_k, 3, 4)
    if device == "cpu":
        with pytest.raises(RuntimeError, match="decreases"):
            llmk.attention_varlen(pq, pk, pv, torch.tensor([0, 6, 8], dtype=torch.int32)[[0, 2, 1]], cu_k, 8, 4)
    else:
        with pytest.raises(RuntimeError, match="is on cpu:0 but q is on cuda:0"):
            llmk.attention(q, k.cpu(), v)


def test_info_names_the_attention_paths(monkeypatch):
    """`llmk info`'s attention lines (forward, backward): the Hopper kernel's head dims on an sm_90
    device with an sm_90a build, the sm_80 kernel for the rest; a forced path is shown."""
    from llmk import cli

    monkeypatch.setattr(llmk._C, "attention_head_dim_compiled", lambda dim: True)
    monkeypatch.delenv("LLMK_ATTENTION_PATH", raising=False)
    forward = (64, 96, 128, 256)  # the Hopper kernels' head dims (an oracle independent of the build)
    assert cli._attention_paths(True, forward).startswith(
        "Hopper TMA + wgmma kernel for fp16/bf16 head dims 64, 96, 128, 256, mma.sync (sm_80) kernel for head dims 32 "
        "and calls")
    assert cli._attention_paths(True, (64, 128)).startswith(
        "Hopper TMA + wgmma kernel for fp16/bf16 head dims 64, 128, mma.sync (sm_80) kernel for head dims 32, 96, 256 "
        "and calls")
    assert cli._attention_paths(False, forward).startswith(
        "mma.sync (sm_80) kernel for head dims 32, 64, 96, 128, 256 (no Hopper kernel here")
    monkeypatch.setattr(llmk._C, "attention_head_dim_compiled", lambda dim: dim == 64)
    monkeypatch.setenv("LLMK_ATTENTION_PATH", "sm80")
    line = cli._attention_paths(True, forward)
    assert "head dims 64, mma.sync (sm_80) kernel for calls" in line
    assert "no kernel for head dims 32, 96, 128, 256 in this build" in line and "set to sm80 here" in line
