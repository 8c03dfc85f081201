"""llmk.attention_decode: the CPU backend and the CUDA kernel against a float64 torch reference
with the FlashAttention error rule (our max error at most 2x that of PyTorch's own attention in
q's dtype against the same reference, plus a small atol), over contiguous and paged caches
(pages shuffled, page sizes 1 to 256), ragged lengths (0 included; up to 64k on the GPU), GQA
groups, q_len 1-16 causal and not, head dims, fp16/bf16, fp8 caches (against the dequantized
reference), append with and without rotary (the caches after the call too: appended rows as
the reference writes them, every other byte unchanged, unused rows NaN), lse; paged and
contiguous caches give the same output; torch.compile(fullgraph=True); CUDA-graph capture
replayed with new lengths; bad inputs; the inference-only error."""

import math

import pytest
import torch
import torch.nn.functional as F

import llmk
from conftest import DEVICES, assert_flash_rule, poison_allocator, requires_cuda

HALF_DTYPES = [torch.float16, torch.bfloat16]
FP8 = torch.float8_e4m3fn
ATOL_EPS = 0.5  # the rule's small absolute slack: half a step of q's dtype (one unit roundoff) at max|ref|


def needs_kernel(device, *dims):
    """Skips a CUDA test of a head dim that this build (CMake's LLMK_HEAD_DIMS) has no kernel for."""
    for dim in dims:
        if device == "cuda" and not llmk._C.attention_head_dim_compiled(dim):
            pytest.skip(f"head_dim {dim} not in this build's LLMK_HEAD_DIMS")


def make_problem(device, dtype, lens, q_len=1, heads_q=4, heads_kv=2, dim=64, page_size=16, fp8=False,
                 append=False, rot_dim=0, interleaved=False, capacity=None):
    """The arguments of one call: a cache holding random keys/values for cache_seqlens tokens of
    each sequence and NaN everywhere else (unused rows and pages), contiguous (page_size None) or
    paged with the pages in random order and garbage (-1) in the table entries a sequence does not
    use; q; k_new / v_new with append; rotary_cos_sin with rot_dim. `capacity` forces the keys per
    sequence the cache can hold (contiguous: max_len; paged: max_pages * page_size)."""
    batch = len(lens)
    need = [n + (q_len if append else 0) for n in lens]
    cache_dtype = FP8 if fp8 else dtype
    if page_size is None:
        max_len = capacity or max(need) + 3
        shape = (batch, max_len, heads_kv, dim)
        table = None
    else:
        pages = [-(-n // page_size) for n in need]
        max_pages = (capacity // page_size) if capacity else max(pages) + 1
        num_pages = sum(pages) + 2
        order = torch.randperm(num_pages).tolist()
        table = torch.full((batch, max_pages), -1, dtype=torch.int32)
        for b, count in enumerate(pages):
            table[b, :count] = torch.tensor(order[:count], dtype=torch.int32)
            order = order[count:]
        table = table.to(device)
        shape = (num_pages, page_size, heads_kv, dim)
    caches = []
    for _ in range(2):
        c = torch.full(shape, float("nan"), dtype=torch.float32, device=device)
        for b, n in enumerate(lens):
            t = torch.arange(n, device=device)
            rows = (b, t) if table is None else (table[b, t // page_size].long(), t % page_size)
            c[rows] = torch.randn(n, heads_kv, dim, device=device) * (1.5 if fp8 else 1.0)
        caches.append(c.to(cache_dtype))
    args = dict(q=torch.randn(batch, q_len, heads_q, dim, dtype=dtype, device=device), k_cache=caches[0],
                v_cache=caches[1], cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=device),
                block_table=table)
    if fp8:
        args["k_scale"] = torch.rand(heads_kv, device=device) + 0.3
        args["v_scale"] = torch.rand(heads_kv, device=device) + 0.3
    if append:
        args["k_new"] = torch.randn(batch, q_len, heads_kv, dim, dtype=dtype, device=device)
        args["v_new"] = torch.randn(batch, q_len, heads_kv, dim, dtype=dtype, device=device)
        if rot_dim:
            args["rotary_cos_sin"] = llmk.rope_cos_sin_cache(max(need) + 2, rot_dim, device=device)
            args["rotary_interleaved"] = interleaved
    return args


def rope_ref(x, positions, cos_sin, interleaved):
    """x [..., tokens, heads, dim] rotated at positions [..., tokens] as rope_ does: float64
    math, rounded to float and then to x's dtype."""
    rot = cos_sin.shape[1]
    half = rot // 2
    cs = cos_sin.double()[positions.long()].unsqueeze(-2)  # [..., tokens, 1, rot]
    cos, sin = cs[..., :half], cs[..., half:]
    xd = x.double().clone()
    i1 = slice(0, rot, 2) if interleaved else slice(0, half)
    i2 = slice(1, rot, 2) if interleaved else slice(half, rot)
    x1, x2 = xd[..., i1].clone(), xd[..., i2].clone()
    xd[..., i1] = x1 * cos - x2 * sin
    xd[..., i2] = x2 * cos + x1 * sin
    return xd.float().to(x.dtype)


def store(values, cache, scale):
    """values (q's dtype) as the cache stores them: fp8 as x / scale (float32, per kv head)
    rounded to nearest even, saturated at +-448."""
    if cache.dtype != FP8:
        return values.to(cache.dtype)
    return (values.float() / scale.float()[:, None]).clamp(-448, 448).to(FP8)


def bits(t):
    """t viewed as integers of its element size (same shape): indexing and NaN-safe equality
    for every dtype, float8 included (PyTorch indexes few ops on float8 tensors)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def gather(cache, rows):
    return bits(cache)[rows].view(cache.dtype)


def slots(args, b, n, first=0):
    """Index tuple of tokens [first, n) of sequence b in a cache."""
    t = torch.arange(first, n, device=args["q"].device)
    table = args.get("block_table")
    if table is None:
        return b, t
    page_size = args["k_cache"].shape[1]
    return table[b, t // page_size].long(), t % page_size


def decode_ref(q, k_cache, v_cache, cache_seqlens, block_table=None, k_new=None, v_new=None, rotary_cos_sin=None,
               rotary_interleaved=False, causal=True, scale=None, k_scale=None, v_scale=None):
    """The call in float64 torch: (out [B, L, Hq, D] f64, lse [B, Hq, L] f64, theirs: PyTorch's SDPA
    in q's dtype on the same (rotated, dequantized) inputs, k_cache and v_cache as the call leaves
    them). Append writes first; q is rotated as a copy."""
    args = dict(q=q, k_cache=k_cache, block_table=block_table)
    batch, q_len, heads_q, dim = q.shape
    group = heads_q // k_cache.shape[2]
    scale = scale or 1 / math.sqrt(dim)
    lens = cache_seqlens.tolist()
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    q = q.clone()
    if k_new is not None:
        k_new = k_new.clone()
        positions = cache_seqlens.long()[:, None] + torch.arange(q_len, device=q.device)[None, :]
        if rotary_cos_sin is not None:
            q = rope_ref(q, positions, rotary_cos_sin, rotary_interleaved)
            k_new = rope_ref(k_new, positions, rotary_cos_sin, rotary_interleaved)
        for b in range(batch):
            new_rows = slots(args, b, lens[b] + q_len, first=lens[b])
            bits(k_cache)[new_rows] = bits(store(k_new[b], k_cache, k_scale))
            bits(v_cache)[new_rows] = bits(store(v_new[b], v_cache, v_scale))
    outs, lses, theirs = [], [], []
    for b in range(batch):
        n = lens[b] + (q_len if k_new is not None else 0)
        rows = slots(args, b, n)
        k, v = gather(k_cache, rows).double(), gather(v_cache, rows).double()  # [n, Hkv, D]
        if k_scale is not None:
            k, v = k * k_scale.double()[:, None], v * v_scale.double()[:, None]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        s = torch.einsum("lhd,nhd->hln", q[b].double(), k) * scale
        mask = torch.ones(q_len, n, dtype=torch.bool, device=q.device)
        if causal:
            mask = torch.arange(n, device=q.device)[None, :] <= torch.arange(q_len, device=q.device)[:, None] + n - q_len
        s = s.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(s, -1)  # [Hq, L]
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        outs.append(torch.einsum("hln,nhd->lhd", p, v))
        lses.append(lse)
        if n == 0:
            theirs.append(torch.zeros_like(q[b]))
            continue
        qt, kt, vt = (t.to(q.dtype).transpose(0, 1)[None] for t in (q[b], k, v))  # [1, Hq, *, D]
        sdpa = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale)
        theirs.append(sdpa[0].transpose(0, 1).nan_to_num(0.0))
    return torch.stack(outs), torch.stack(lses), torch.stack(theirs), k_cache, v_cache


def check(args, what="out", atol_lse=1e-4):
    """One call with lse against the reference: the FlashAttention rule on out, queries without
    keys exactly 0 with lse -inf, lse close, and the caches: appended rows as the reference's
    (exactly, or within a rounding of the rotation for rotated k), every other byte unchanged."""
    before = {name: args[name].clone() for name in ("k_cache", "v_cache")}
    ref_args = {name: (t.clone() if torch.is_tensor(t) else t) for name, t in args.items()}
    want, want_lse, theirs, k_after, v_after = decode_ref(**ref_args)
    out, lse = llmk.attention_decode(**args, return_lse=True)
    q = args["q"]
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
    assert_flash_rule(out, want, theirs, q.dtype, what, ATOL_EPS)
    no_keys = torch.isinf(want_lse)  # [B, Hq, L]
    assert (out.transpose(1, 2)[no_keys] == 0).all(), f"{what}: queries that see no key are not exactly 0"
    assert (lse[no_keys] == float("-inf")).all()
    torch.testing.assert_close(lse[~no_keys].double(), want_lse[~no_keys], rtol=1e-5, atol=atol_lse)
    appended = torch.zeros(args["k_cache"].shape[:3], dtype=torch.bool, device=q.device)
    if args.get("k_new") is not None:
        for b, n in enumerate(args["cache_seqlens"].tolist()):
            appended[slots(args, b, n + q.shape[1], first=n)] = True
    rotary = args.get("rotary_cos_sin")
    for name, after in (("k_cache", k_after), ("v_cache", v_after)):
        got, was, want = bits(args[name]), bits(before[name]), bits(after)
        assert torch.equal(got[~appended], was[~appended]), f"{name}: rows outside the appended ones changed"
        # Unrotated values are stored as the reference stores them; rotated ones may round once
        # differently (the kernel rotates in float32, the reference in float64).
        rot = rotary.shape[1] if rotary is not None and name == "k_cache" else 0
        assert torch.equal(got[appended][..., rot:], want[appended][..., rot:]), f"{name}: appended rows differ"
        if rot:
            g = got[appended][..., :rot].view(args[name].dtype).double()
            w = want[appended][..., :rot].view(args[name].dtype).double()
            if args[name].dtype == FP8:  # one e4m3 step (in stored units)
                ok = (g - w).abs() <= 0.125 * w.abs() + 2.0**-9
            else:  # one step of the dtype, and float32's error of the rotation where it cancels
                ok = (g - w).abs() <= torch.finfo(args[name].dtype).eps * w.abs() + 1e-5 * args["k_new"].abs().max()
            assert ok.all(), f"{name}: {int((~ok).sum())} rotated appended elements differ from the reference"
    return out, lse


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("page_size", [None, 1, 16, 48])
@pytest.mark.parametrize("q_len,causal", [(1, True), (4, True), (4, False)])
def test_matches_reference(device, dtype, page_size, q_len, causal):
    dim = 128 if device == "cuda" else 64
    needs_kernel(device, dim)
    lens = [0, 1, 37, 300] if device == "cpu" else [0, 1, 37, 300, 2000, 4097]
    args = make_problem(device, dtype, lens, q_len=q_len, heads_q=8, heads_kv=2, dim=dim, page_size=page_size)
    check(dict(args, causal=causal))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16])
def test_gqa_group_sizes(device, group):
    needs_kernel(device, 128)
    args = make_problem(device, torch.bfloat16, [129, 5, 0], q_len=2, heads_q=2 * group, heads_kv=2, dim=128)
    check(args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [64, 96, 128, 256])
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_head_dims(device, dim, dtype):
    needs_kernel(device, dim)
    args = make_problem(device, dtype, [70, 3, 200], q_len=3, heads_q=6, heads_kv=3, dim=dim, page_size=32)
    check(args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("q_len", [1, 2, 5, 8, 16])
def test_query_lengths(device, q_len):
    """Speculative tokens: causal bottom-right, with sequences shorter than q_len (the first
    tokens see no key)."""
    needs_kernel(device, 128)
    args = make_problem(device, torch.float16, [max(q_len - 2, 0), 300, q_len], q_len=q_len, heads_q=8,
                        heads_kv=2, dim=128, page_size=16)
    check(args)
    check(dict(args, causal=False), what="out (not causal)")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("fp8", [False, True], ids=["cache_like_q", "fp8_cache"])
@pytest.mark.parametrize("rotary", [None, "neox", "gptj_partial"])
@pytest.mark.parametrize("page_size", [None, 16])
def test_append(device, dtype, fp8, rotary, page_size):
    """k_new / v_new written at cache_seqlens + i (rotated, quantized) and attended in the same call."""
    dim = 128
    needs_kernel(device, dim)
    rot_dim = {None: 0, "neox": dim, "gptj_partial": dim // 2}[rotary]
    args = make_problem(device, dtype, [0, 15, 16, 100], q_len=3, heads_q=8, heads_kv=2, dim=dim,
                        page_size=page_size, fp8=fp8, append=True, rot_dim=rot_dim, interleaved=rotary == "gptj_partial")
    q_before, new_before = args["q"].clone(), args["k_new"].clone()
    check(args, atol_lse=2e-3 if rot_dim else 1e-4)
    assert torch.equal(args["q"], q_before) and torch.equal(args["k_new"], new_before), "q / k_new were modified"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("q_len", [1, 7])
def test_fp8_cache(device, dtype, q_len):
    """An e4m3 cache with per-head scales against the reference over its dequantized values."""
    needs_kernel(device, 128)
    lens = [500, 0, 31] if device == "cpu" else [5000, 0, 31, 257]
    check(make_problem(device, dtype, lens, q_len=q_len, heads_q=10, heads_kv=2, dim=128, page_size=32, fp8=True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page_size", [1, 16, 48])
def test_paged_equals_contiguous(device, page_size):
    """The same keys in a paged cache (pages shuffled) and a contiguous one of the same capacity
    give the same out and lse, bit for bit (the same arithmetic on the same values)."""
    needs_kernel(device, 128)
    lens = [0, 100, 481, 7]
    capacity = 48 * 11
    paged = make_problem(device, torch.bfloat16, lens, q_len=2, heads_q=8, heads_kv=2, dim=128, page_size=page_size,
                         capacity=capacity)
    flat = dict(paged, block_table=None)
    for name in ("k_cache", "v_cache"):
        c = torch.full((len(lens), capacity) + paged[name].shape[2:], float("nan"), dtype=paged[name].dtype,
                       device=device)
        for b, n in enumerate(lens):
            c[b, :n] = gather(paged[name], slots(paged, b, n))
        flat[name] = c
    out_p, lse_p = llmk.attention_decode(**paged, return_lse=True)
    out_c, lse_c = llmk.attention_decode(**flat, return_lse=True)
    assert torch.equal(out_p, out_c) and torch.equal(lse_p, lse_c)


@requires_cuda
@pytest.mark.parametrize("heads_q,heads_kv", [(8, 1), (32, 8)])
def test_long_ragged_contexts(heads_q, heads_kv):
    """Ragged lengths up to 64k in one batch, and one sequence alone (the split-KV path)."""
    needs_kernel("cuda", 128)
    check(make_problem("cuda", torch.bfloat16, [0, 65535, 1, 4097, 12345], q_len=1, heads_q=heads_q,
                       heads_kv=heads_kv, dim=128, page_size=256))
    check(make_problem("cuda", torch.bfloat16, [32768], heads_q=heads_q, heads_kv=heads_kv, dim=128, page_size=None))


@pytest.mark.parametrize("device", DEVICES)
def test_no_keys(device):
    """Sequences without keys: out 0, lse -inf (causal or not)."""
    needs_kernel(device, 64)
    args = make_problem(device, torch.bfloat16, [0, 0], q_len=3)
    for causal in (True, False):
        out, lse = llmk.attention_decode(**args, causal=causal, return_lse=True)
        assert (out == 0).all() and (lse == float("-inf")).all()


@requires_cuda
def test_outputs_are_fully_written():
    """Outputs allocated over NaN (the caching allocator hands the op poisoned blocks)."""
    needs_kernel("cuda", 128)
    args = make_problem("cuda", torch.float16, [1000, 3, 0], q_len=4, heads_q=12, heads_kv=4, dim=128)
    poison_allocator(args["q"])
    out, lse = llmk.attention_decode(**args, return_lse=True)
    assert not out.isnan().any() and not lse.isnan().any()


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    """A decode step (append + rotary, paged, fp8) under torch.compile(fullgraph=True): the same
    out and the same cache writes as eagerly."""
    needs_kernel(device, 64)
    args = make_problem(device, torch.bfloat16, [5, 40], q_len=2, heads_q=4, heads_kv=2, dim=64, fp8=True,
                        append=True, rot_dim=64)

    def step(q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new, rotary_cos_sin, k_scale, v_scale):
        out = llmk.attention_decode(q * 2, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new,
                                    rotary_cos_sin, k_scale=k_scale, v_scale=v_scale)
        return out.float().sum(-1)

    names = ("q", "k_cache", "v_cache", "cache_seqlens", "block_table", "k_new", "v_new", "rotary_cos_sin", "k_scale",
             "v_scale")
    eager_args = [args[n].clone() for n in names]
    compiled_args = [args[n].clone() for n in names]
    backend = "inductor" if device == "cuda" else "aot_eager"
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True, backend=backend)(*compiled_args)
    want = step(*eager_args)
    torch.testing.assert_close(got, want)
    for name, g, w in zip(names, compiled_args, eager_args):
        assert torch.equal(bits(g), bits(w)), f"{name} differs after the compiled call"


@requires_cuda
@pytest.mark.parametrize("append", [False, True])
def test_cuda_graph_replays_with_new_lengths(append):
    """One call captured in a CUDA graph (its workspace from the graph's pool), replayed with new
    cache_seqlens (and new k_new / v_new) copied into the same tensors."""
    needs_kernel("cuda", 128)
    replays = [[100, 0, 3000], [0, 4000, 1], [4090, 4090, 4090], [0, 0, 0], [17, 2049, 333]]
    args = make_problem("cuda", torch.bfloat16, [4096] * 3, q_len=2, heads_q=8, heads_kv=2, dim=128, append=append,
                        rot_dim=128 if append else 0, capacity=4112)
    if append:  # the keys the replays append at: within the capacity and the cos/sin cache
        args["cache_seqlens"].fill_(4090)
    saved = {name: args[name].clone() for name in ("k_cache", "v_cache")}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up (the caches are restored after)
        llmk.attention_decode(**args, return_lse=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = llmk.attention_decode(**args, return_lse=True)
    for name in saved:
        args[name].copy_(saved[name])
    for lens in replays:
        args["cache_seqlens"].copy_(torch.tensor(lens, dtype=torch.int32))
        if append:
            args["k_new"].copy_(torch.randn_like(args["k_new"]))
            args["v_new"].copy_(torch.randn_like(args["v_new"]))
        ref_args = {name: (t.clone() if torch.is_tensor(t) else t) for name, t in args.items()}
        want, want_lse, theirs, k_after, v_after = decode_ref(**ref_args)
        graph.replay()
        torch.cuda.synchronize()
        assert_flash_rule(out, want, theirs, torch.bfloat16, f"replay {lens}", ATOL_EPS)
        finite = ~torch.isinf(want_lse)
        torch.testing.assert_close(lse[finite].double(), want_lse[finite], rtol=1e-5, atol=2e-3)
        assert (lse[~finite] == float("-inf")).all()
        if append:  # the next replay reads the rows this one appended, as the reference wrote them
            unrotated = (slice(None),) * 3 + (slice(128, None),)
            assert torch.equal(bits(args["v_cache"]), bits(v_after))
            assert torch.equal(bits(args["k_cache"])[unrotated], bits(k_after)[unrotated])
            args["k_cache"].copy_(k_after)


def test_requires_grad_raises():
    args = make_problem("cpu", torch.bfloat16, [4])
    args["q"].requires_grad_(True)
    with pytest.raises(RuntimeError, match="inference op"):
        llmk.attention_decode(**args)
    with torch.no_grad():
        llmk.attention_decode(**args)


def test_fp8_tensors_reach_the_ops():
    """torch.float8_e4m3fn maps to llmk's f8e4m3: ops that do not take it say so by name;
    other float8 formats are refused at the bridge."""
    x = torch.randn(4, 64).to(FP8)
    with pytest.raises(RuntimeError, match="rmsnorm: x has unsupported dtype float8_e4m3fn"):
        llmk.rmsnorm(x, torch.ones(64))
    args = make_problem("cpu", torch.bfloat16, [4])
    with pytest.raises(RuntimeError, match=r"attention_decode: k_cache is .*5.*; llmk takes"):
        llmk.attention_decode(**dict(args, k_cache=args["k_cache"].to(torch.float8_e5m2)))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    needs_kernel(device, 64)
    args = make_problem(device, torch.bfloat16, [5, 20], q_len=2, append=True, rot_dim=64)
    k_cache, v_cache = args["k_cache"].clone(), args["v_cache"].clone()

    def call(**changes):
        llmk.attention_decode(**dict(args, **changes))

    cases = [
        (dict(q=args["q"].float()), "attention_decode: q must be float16 or bfloat16, got float32"),
        (dict(q=args["q"][..., :32]), "q has head_dim 32; supported head dims are 64, 96, 128 and 256"),
        (dict(q=args["q"][:, :, :3]), r"heads_q \(3\) must be a positive multiple of heads_kv \(2"),
        (dict(q=args["q"][:, :0]), "q has q_len 0"),
        (dict(k_cache=args["k_cache"].half()), r"k_cache has dtype float16; the cache holds q's dtype \(bfloat16\)"),
        (dict(v_cache=args["v_cache"][:, :8]), "v_cache has shape"),
        (dict(k_cache=args["k_cache"].to(FP8), v_cache=args["v_cache"].to(FP8)),
         "a float8_e4m3fn cache needs k_scale"),
        (dict(k_scale=torch.ones(2, device=device)), "k_scale is given but the cache is bfloat16"),
        (dict(block_table=args["block_table"].long()), "block_table has dtype int64, expected int32"),
        (dict(block_table=args["block_table"][:1]), r"block_table must be int32 \[batch, max_pages\] with batch 2"),
        (dict(block_table=None), "k_cache has batch"),
        (dict(cache_seqlens=args["cache_seqlens"].long()), "cache_seqlens has dtype int64, expected int32"),
        (dict(k_new=None), "k_new and v_new are appended together; got v_new without k_new"),
        (dict(k_new=None, v_new=None), "rotary_cos_sin rotates q and the appended k_new"),
        (dict(k_new=args["k_new"][:, :1]), r"k_new must be \[batch, q_len, heads_kv, head_dim\] = \[2, 2, 2, 64\]"),
        (dict(v_new=args["v_new"].half()), "v_new has dtype float16, expected bfloat16"),
        (dict(rotary_cos_sin=args["rotary_cos_sin"][:, :63].contiguous()), "rotary_cos_sin has rotary_dim 63"),
        (dict(rotary_cos_sin=args["rotary_cos_sin"].double()), "rotary_cos_sin is float64; llmk takes"),
        (dict(rotary_cos_sin=args["cache_seqlens"][None]), "rotary_cos_sin has dtype int32, expected float32"),
        (dict(v_cache=args["k_cache"]), "k_cache and v_cache are the same tensor"),
        (dict(k_new=args["k_cache"][:2, :2]), "k_cache and k_new overlap in memory"),
        (dict(scale=0.0), "scale must be finite and > 0"),
    ]
    for changes, message in cases:
        with pytest.raises(RuntimeError, match=message):
            call(**changes)
    if device == "cpu":  # the contract, checked on the host
        table = args["block_table"].clone()
        table[1, 1] = 1000
        with pytest.raises(RuntimeError, match=r"block_table\[1\]\[1\] = 1000 is outside the cache's"):
            call(block_table=table)
        with pytest.raises(RuntimeError, match=r"cache_seqlens\[0\] = -1 is negative"):
            call(cache_seqlens=torch.tensor([-1, 3], dtype=torch.int32))
        with pytest.raises(RuntimeError, match=r"exceed the paged cache's capacity"):
            call(cache_seqlens=torch.tensor([5, 1000], dtype=torch.int32))
        with pytest.raises(RuntimeError, match=r"rotary position .* is outside rotary_cos_sin's"):
            call(rotary_cos_sin=args["rotary_cos_sin"][:6])
    else:
        with pytest.raises(RuntimeError, match="cache_seqlens is on cpu:0 but q is on cuda:0"):
            call(cache_seqlens=args["cache_seqlens"].cpu())
    # Nothing was written by a rejected call.
    assert torch.equal(bits(args["k_cache"]), bits(k_cache)) and torch.equal(bits(args["v_cache"]), bits(v_cache))
