"""llmk.attention_decode with many query tokens on Hopper: from 64 query tokens (or forced by
LLMK_DECODE_PATH=prefill) the prefill kernel reads the cache (chunked prefill, prefix caching):
contiguous and paged caches (shuffled pages of 8 to 256 rows, 24 among them), the cache's unused
rows NaN (the kernel zero-fills past each sequence's end), sequences shorter than q_len (rows
without keys), causal and not, head dims 64 / 96 / 128, GQA, the score variants, against the
float64 reference by the FlashAttention rule; what the path does not take (fp8 caches, append,
page sizes off 8, head dim 256) goes to the decode kernel, or raises where the path is forced."""

import pytest
import torch

import llmk
from conftest import poison_allocator, requires_cuda
from test_attention_decode import HALF_DTYPES, check, make_problem, slots
from test_attention_variants import assert_sequence_matches, hopper_forward

pytestmark = requires_cuda


@pytest.fixture(autouse=True)
def hopper():
    if not hopper_forward():
        pytest.skip("the prefill path over a cache runs on the Hopper forward")


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("dim", [64, 96, 128])
@pytest.mark.parametrize("page_size", [None, 8, 16, 24, 128, 256])
@pytest.mark.parametrize("causal", [True, False])
def test_matches_reference(monkeypatch, dtype, dim, page_size, causal):
    monkeypatch.setenv("LLMK_DECODE_PATH", "prefill")
    lens = [0, 100, 128, 1000, 2049]
    args = make_problem("cuda", dtype, lens, q_len=200, heads_q=8, heads_kv=2, dim=dim, page_size=page_size)
    poison_allocator(args["q"])
    check(dict(args, causal=causal), what=f"prefill page {page_size}")


@pytest.mark.parametrize("q_len", [1, 17, 64, 127, 129, 700])
@pytest.mark.parametrize("path", ["prefill", "auto", "decode"])
def test_query_lengths(monkeypatch, q_len, path):
    """Every q_len on either kernel (forced) and on the default path (the decode kernel below 64);
    q_len 700 walks the persistent grid over several units per block."""
    monkeypatch.setenv("LLMK_DECODE_PATH", path)
    args = make_problem("cuda", torch.bfloat16, [700, 3000, 5], q_len=q_len, heads_q=16, heads_kv=4, dim=128,
                        page_size=16)
    check(dict(args, causal=True), what=f"q_len {q_len} {path}")


@pytest.mark.parametrize("heads_q,heads_kv", [(32, 8), (8, 8), (8, 1), (12, 4)])
def test_gqa_groups(monkeypatch, heads_q, heads_kv):
    monkeypatch.setenv("LLMK_DECODE_PATH", "prefill")
    args = make_problem("cuda", torch.float16, [300, 1500], q_len=256, heads_q=heads_q, heads_kv=heads_kv, dim=128,
                        page_size=64)
    check(dict(args, causal=True), what=f"heads {heads_q}/{heads_kv}")


def test_long_prefix(monkeypatch):
    """A 2048-token chunk after a 6000-token prefix in 64-row pages (many key blocks per tile)."""
    monkeypatch.setenv("LLMK_DECODE_PATH", "prefill")
    args = make_problem("cuda", torch.bfloat16, [8048, 2100], q_len=2048, heads_q=8, heads_kv=2, dim=128,
                        page_size=64)
    check(dict(args, causal=True), what="long prefix")


@pytest.mark.parametrize("lens,capacity,q_len", [([256, 100], 256, 100), ([100], 100, 64), ([40, 0], 60, 64)],
                         ids=["full_last_block", "capacity_below_a_block", "short"])
def test_contiguous_capacity_edges(monkeypatch, lens, capacity, q_len):
    """Contiguous caches whose capacity ends a full key block, or holds less than one (the map's
    rows below its 128-row box), the rows past each sequence NaN."""
    monkeypatch.setenv("LLMK_DECODE_PATH", "prefill")
    args = make_problem("cuda", torch.float16, lens, q_len=q_len, heads_q=8, heads_kv=2, dim=128, page_size=None,
                        capacity=capacity)
    check(dict(args, causal=True), what=f"contiguous capacity {capacity}")


@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("page_size", [None, 16])
@pytest.mark.parametrize("variants", [dict(window=300), dict(window=7, sinks=True), dict(softcap=30.0),
                                      dict(window=1000, softcap=50.0, sinks=True)], ids=str)
def test_score_variants(monkeypatch, dim, page_size, variants):
    """The window (counted back from each query's own position), softcap and sinks over the
    cache against the prefill formula per sequence."""
    monkeypatch.setenv("LLMK_DECODE_PATH", "prefill")
    dtype, heads_q, heads_kv, q_len = torch.bfloat16, 8, 2, 300
    lens = [1300, 200, 2500]
    args = make_problem("cuda", dtype, lens, q_len=q_len, heads_q=heads_q, heads_kv=heads_kv, dim=dim,
                        page_size=page_size)
    kw = dict(variants)
    sinks = torch.randn(heads_q, device="cuda") if kw.pop("sinks", False) else None
    out, lse = llmk.attention_decode(**args, causal=True, scale=dim**-0.5, return_lse=True, sinks=sinks, **kw)
    for b, n in enumerate(lens):
        rows = slots(args, b, n)
        ref = (args["q"][b:b + 1], args["k_cache"][rows][None], args["v_cache"][rows][None], True, dim**-0.5,
               kw.get("window"), kw.get("softcap"), sinks)
        assert_sequence_matches(out[b:b + 1], lse[b:b + 1], ref, dtype, f"prefill variants sequence {b}", 2e-3)


@pytest.mark.parametrize("case,needle", [
    (dict(fp8=True), "the cache is float8_e4m3fn"),
    (dict(append=True), "the call appends to the cache"),
    (dict(page_size=12), "the page size is not a multiple of 8"),
    (dict(dim=256), "the head dim is above 128"),
], ids=["fp8", "append", "page12", "dim256"])
def test_what_the_path_does_not_take(monkeypatch, case, needle):
    """Forced, the path raises naming the reason and writes nothing; by default those calls run
    the decode kernel and match the reference."""
    if case.get("dim") == 256 and not llmk._C.attention_head_dim_compiled(256):
        pytest.skip("head_dim 256 not in this build's LLMK_HEAD_DIMS")
    kw = dict(dim=128, page_size=16)
    kw.update(case)
    args = make_problem("cuda", torch.bfloat16, [500, 90], q_len=100, heads_q=8, heads_kv=2, **kw)
    monkeypatch.setenv("LLMK_DECODE_PATH", "prefill")
    before = {name: args[name].clone() for name in ("k_cache", "v_cache")}
    with pytest.raises(RuntimeError, match=f"attention_decode: LLMK_DECODE_PATH=prefill cannot take this call: {needle}"):
        llmk.attention_decode(**args)
    for name, was in before.items():
        assert torch.equal(args[name].view(torch.uint8), was.view(torch.uint8)), f"{name} written by a rejected call"
    monkeypatch.setenv("LLMK_DECODE_PATH", "auto")
    check(dict(args, causal=True), what=f"auto {needle}")


def test_bad_path_name(monkeypatch):
    monkeypatch.setenv("LLMK_DECODE_PATH", "fast")
    args = make_problem("cuda", torch.bfloat16, [10], q_len=100, dim=128)
    with pytest.raises(RuntimeError, match="attention_decode: LLMK_DECODE_PATH=fast is not one of auto, decode, prefill"):
        llmk.attention_decode(**args)
