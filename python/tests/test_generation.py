"""``llmk.patch(model, decode=True)``: ``generate`` on llmk's KV cache and decode kernels, against
the same model unpatched (transformers' DynamicCache and SDPA) on tiny models of each family it
serves (random weights): the scores of every step of a greedy generation over a ragged,
left-padded batch, fp8 and paged caches, the cache's own logic (capacity, reuse, reorder, crop),
the CUDA-graph steps on the GPU, and the models and arguments it rejects."""

import pytest
import torch

import llmk
from conftest import DEVICES

transformers = pytest.importorskip("transformers")
generation = pytest.importorskip("llmk.generation")
from hf_models import OpCounter, assert_generation_follows, greedy, tiny_model  # noqa: E402 (needs transformers)

SIZES = dict(hidden_size=256, intermediate_size=512, head_dim=64, vocab_size=512, max_position_embeddings=512)
FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "gpt_oss")
# Each family's attention as its real models have it, at windows shorter than the generation:
# Mistral's sliding window, Gemma 2's soft-capping (attention and final logits) and
# alternating windows, Gemma 3's windows and two rotary tables, gpt-oss's sinks and windows.
FAMILY_SETTINGS = {"mistral": dict(sliding_window=16), "gemma2": dict(attn_logit_softcapping=50.0, sliding_window=16)}
# Scores (logits) of two bf16 models that round differently differ by a few bf16 steps of the
# largest logit (test_patch's tolerance); the fp8 cache adds e4m3's rounding of k and v.
TOLERANCE = 4e-2
FP8_TOLERANCE = 1.5e-1
PROMPT, NEW = 23, 64


def _model(family, device, dtype=torch.bfloat16, **overrides):
    return tiny_model(family, device, dtype, **{**SIZES, **overrides})


def _prompts(device, batch=3, pad=(0, 5, 11)):
    """A left-padded batch of ragged prompts: prompt b has pad[b] pad tokens first."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, SIZES["vocab_size"], (batch, PROMPT), generator=g)
    mask = torch.ones_like(ids)
    for b, p in enumerate(pad[:batch]):
        ids[b, :p], mask[b, :p] = 0, 0
    return ids.to(device), mask.to(device)


def _generate(model, ids, mask, new=NEW, **kwargs):
    return greedy(model, ids, mask, new, **kwargs)


DECODE_OPS = ("attention", "attention_varlen", "attention_decode")


def _Counter(monkeypatch, names=DECODE_OPS):
    return OpCounter(monkeypatch, names)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_follows_the_model(family, device, monkeypatch):
    model = _model(family, device, **FAMILY_SETTINGS.get(family, {}))
    if generation.unsupported(model):  # the score variants' prefill off the Hopper forward
        pytest.skip(generation.unsupported(model))
    ids, mask = _prompts(device)
    want = _generate(model, ids, mask)
    report = llmk.patch(model, decode=True)
    counter = _Counter(monkeypatch)
    got = _generate(model, ids, mask)
    assert_generation_follows(got, want, TOLERANCE, f"{family} on {device}")
    layers = model.config.num_hidden_layers
    # the padded prefill on varlen attention, every step one attention_decode per layer
    # (on the GPU the steps after the second are graph replays: no Python runs)
    assert counter.calls["attention_varlen"] == layers and counter.calls["attention"] == 0
    steps = NEW - 1 if device == "cpu" else 2
    assert counter.calls["attention_decode"] == layers * steps
    cache = model._llmk_patch["decode"].cache
    assert cache.length == PROMPT + NEW - 1 and cache.seqlens.tolist() == [PROMPT + NEW - 1 - p for p in (0, 5, 11)]
    if device == "cuda":
        assert cache._graph is not None
    assert any(k.startswith("generation") for k in report.replaced)
    llmk.unpatch(model)
    assert "_prepare_cache_for_generation" not in model.__dict__
    again = _generate(model, ids, mask, new=4)
    assert torch.equal(again[0], want[0][:, :4])


@pytest.mark.parametrize("device", DEVICES)
def test_unpadded_prefill_and_later_calls_reuse_the_cache(device, monkeypatch):
    model = _model("qwen3", device)
    ids, _ = _prompts(device, batch=2, pad=(0, 0))
    mask = torch.ones_like(ids)
    want = _generate(model, ids, mask, new=12)
    llmk.patch(model, decode=True)
    counter = _Counter(monkeypatch)
    first = _generate(model, ids, mask, new=12)
    cache = model._llmk_patch["decode"].cache
    second = _generate(model, ids, mask, new=12)
    assert model._llmk_patch["decode"].cache is cache, "a generate call that fits must reuse the cache"
    assert counter.calls["attention"] == 2 * model.config.num_hidden_layers and counter.calls["attention_varlen"] == 0
    for got in (first, second):
        assert_generation_follows(got, want, TOLERANCE, f"qwen3 on {device}")
    torch.testing.assert_close(second[1], first[1], rtol=0, atol=0)
    _generate(model, ids, mask, new=600)  # longer than the cache: a new, larger one
    assert model._llmk_patch["decode"].cache.capacity >= PROMPT + 600
    llmk.unpatch(model)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page_size", [None, 16])
def test_fp8_and_paged_caches(page_size, device):
    model = _model("llama", device)
    ids, mask = _prompts(device)
    want = _generate(model, ids, mask, new=24)
    llmk.patch(model, decode=True, kv_cache_dtype=torch.float8_e4m3fn, kv_page_size=page_size)
    got = _generate(model, ids, mask, new=24)
    assert_generation_follows(got, want, FP8_TOLERANCE, f"fp8 cache, pages {page_size}")
    fp8 = model._llmk_patch["decode"].cache
    assert fp8.keys.dtype == torch.float8_e4m3fn and (fp8.block_table is not None) == (page_size is not None)
    llmk.unpatch(model)
    # the first layer's prompt slots (the same keys and values in both) hold the bf16 cache's to
    # e4m3's precision: half a step of 3 mantissa bits, or of the smallest normal (2^-6 x scale)
    llmk.patch(model, decode=True, kv_page_size=page_size)
    _generate(model, ids, mask, new=24)
    bf16 = model._llmk_patch["decode"].cache
    for store, exact, scales in ((fp8.keys, bf16.keys, fp8.k_scale), (fp8.values, bf16.values, fp8.v_scale)):
        scale = scales[0].view(1, -1, 1)
        for b, length in enumerate((PROMPT, PROMPT - 5, PROMPT - 11)):
            got_b, want_b = store[0, b, :length].float() * scale, exact[0, b, :length].float()
            assert ((got_b - want_b).abs() <= 2**-4 * want_b.abs() + 2**-7 * scale).all()
    llmk.unpatch(model)


def test_the_cache_logic():
    model = _model("llama", "cpu")
    llmk.patch(model, decode=True)
    ids, mask = _prompts("cpu", batch=2, pad=(0, 3))
    cache = generation.KVCache(model, 2, 40)
    assert cache.capacity == 256 and "2 sequences x 256 slots" in repr(cache)
    with torch.no_grad():
        model(ids, attention_mask=mask, past_key_values=cache)
        assert cache.length == PROMPT and cache.seqlens.tolist() == [PROMPT, PROMPT - 3]
        saved = cache.keys[:, :, :PROMPT].clone()
        cache.reorder_cache(torch.tensor([1, 0]))
        assert cache.seqlens.tolist() == [PROMPT - 3, PROMPT]
        assert torch.equal(cache.keys[:, 0, :PROMPT], saved[:, 1]) and torch.equal(cache.keys[:, 1, :PROMPT], saved[:, 0])
        cache.crop(-5)
        assert cache.length == PROMPT - 5 and cache.seqlens.tolist() == [PROMPT - 8, PROMPT - 5]
        cache.crop(PROMPT - 5)  # the older form: the length to keep (here all of it)
        assert cache.length == PROMPT - 5
        model(ids[:, :1], past_key_values=cache)  # a step: one more token each
        assert cache.seqlens.tolist() == [PROMPT - 7, PROMPT - 4]
        with pytest.raises(ValueError, match=r"exceed its 256 slots \(sized for max_length 40\)"):
            model(torch.zeros(2, 256, dtype=torch.long), past_key_values=cache)
        with pytest.raises(ValueError, match="a batch of 3 sequences, but the cache holds 2"):
            model(torch.zeros(3, 1, dtype=torch.long), past_key_values=cache)
        cache.reset()
        right = torch.ones_like(mask)
        right[0, -2:] = 0
        with pytest.raises(ValueError, match="left-padded"):
            model(ids, attention_mask=right, past_key_values=cache)
        with pytest.raises(NotImplementedError, match="contrastive search"):
            cache.batch_repeat_interleave(2)
        with pytest.raises(RuntimeError, match="written by llmk's attention"):
            cache.update(None, None, 0)
    llmk.unpatch(model)


def test_beam_search_and_sampling_run():
    model = _model("llama", "cpu")
    ids, mask = _prompts("cpu", batch=2, pad=(0, 4))
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=10, num_beams=3, do_sample=False,
                              pad_token_id=0, eos_token_id=None)
    llmk.patch(model, decode=True)
    with torch.no_grad():
        got = model.generate(ids, attention_mask=mask, max_new_tokens=10, num_beams=3, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
        assert model._llmk_patch["decode"].cache.batch_size == 6
        sampled = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=True, top_k=20,
                                 pad_token_id=0, eos_token_id=None)
    assert got.shape == want.shape and sampled.shape == (2, PROMPT + 10)
    # beams that differ from the reference's only through a near-tie are rare on this model: most agree
    assert (got == want).all(dim=1).sum() >= 1
    llmk.unpatch(model)


def test_what_decode_cannot_serve_is_rejected():
    with pytest.raises(ValueError, match="float16/bfloat16"):
        llmk.patch(_model("llama", "cpu", torch.float32), decode=True)
    odd = _model("llama", "cpu", head_dim=80)
    with pytest.raises(ValueError, match="head_dim 80 has no llmk.attention_decode kernel"):
        llmk.patch(odd, decode=True)
    model = _model("llama", "cpu")
    with pytest.raises(ValueError, match="pass decode=True"):
        llmk.patch(model, kv_cache_dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="kv_cache_dtype must be"):
        llmk.patch(model, decode=True, kv_cache_dtype=torch.float16)


def test_eos_and_prompt_lookup_decoding():
    """EOS ends a sequence early (the batch keeps stepping with padding), and prompt-lookup
    decoding verifies several draft tokens per forward (attention_decode with q_len > 1) and
    crops the rejected ones from the cache: both as the unpatched model generates."""
    model = _model("llama", "cpu")
    ids, mask = _prompts("cpu", batch=2, pad=(0, 6))
    ids[:, -8:] = ids[:, 3:11].clone()  # repeated n-grams for the lookup to find
    mask[:, -8:] = 1
    with torch.no_grad():
        first = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    eos = int(first[0, PROMPT + 4])  # a token the first sequence generates: it stops there
    runs = {}
    for patched in (False, True):
        if patched:
            llmk.patch(model, decode=True)
        runs[patched] = (_generate(model, ids, mask, new=16, eos_token_id=eos),
                         _generate(model, ids[:1], mask[:1], new=16, prompt_lookup_num_tokens=3))
    llmk.unpatch(model)
    for what, want, got in zip(("eos", "prompt lookup"), runs[False], runs[True]):
        assert got[0].shape == want[0].shape
        assert_generation_follows(got, want, TOLERANCE, what)
    assert (runs[True][0][0][0, 5:] == 0).all(), "the sequence that met EOS continues with padding"


def test_cache_reuse_and_the_paths_left_to_transformers():
    """The kept cache survives inference mode, is made again when the model changes dtype, and
    the calls llmk's forward does not serve (chunked prefill, hidden states) run transformers'
    cache; paged capacities round to the page; crop takes the 0-d tensor assisted generation
    passes."""
    model = _model("llama", "cpu")
    ids, mask = _prompts("cpu", batch=2, pad=(0, 3))
    want = _generate(model, ids, mask, new=6)
    chunked = _generate(model, ids, mask, new=6, prefill_chunk_size=8)
    llmk.patch(model, decode=True)
    with torch.inference_mode():
        _generate(model, ids, mask, new=6)
    cache = model._llmk_patch["decode"].cache
    assert_generation_follows(_generate(model, ids, mask, new=6), want, TOLERANCE, "after inference mode")
    assert model._llmk_patch["decode"].cache is cache
    assert_generation_follows(_generate(model, ids, mask, new=6, prefill_chunk_size=8), chunked, TOLERANCE, "chunked prefill")
    with torch.no_grad():
        hidden = model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0,
                                output_hidden_states=True, return_dict_in_generate=True)
    assert len(hidden.hidden_states) == 3 and model._llmk_patch["decode"].cache is cache
    model.to(torch.float16)
    _generate(model, ids, mask, new=6)
    assert model._llmk_patch["decode"].cache is not cache
    assert model._llmk_patch["decode"].cache.keys.dtype == torch.float16
    llmk.unpatch(model)
    model.to(torch.bfloat16)
    assert generation.KVCache(model, 1, 100, page_size=100).capacity == 300
    with pytest.raises(ValueError, match="page_size must be an int >= 1"):
        generation.KVCache(model, 1, 100, page_size=0)
    cache = generation.KVCache(model, 2, 40)
    cache.length = 10
    cache.crop(torch.tensor(-3))
    assert cache.length == 7 and isinstance(cache.length, int)
    cache.crop(5)
    assert cache.length == 5 and cache.seqlens.tolist() == [0, 0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family,scheme", [("llama", "int4-g128"), ("llama", "int8"), ("qwen2", "int4-g128")])
def test_quantized_model_generates_as_its_dequantized_weights(family, scheme, device, monkeypatch):
    """patch(quantize=...) with decode=True: greedy generation follows the same model whose
    nn.Linear weights are the dequantized ones (unpatch puts exactly those back), every
    decoder projection on llmk.quantized_linear, q/k/v and gate/up fused: four launches per
    layer (the one-token steps graph-replayed on CUDA)."""
    model = _model(family, device)  # (qwen2's q/k/v have biases: fused too)
    ids, mask = _prompts(device)
    report = llmk.patch(model, decode=True, quantize=scheme)
    layers = model.config.num_hidden_layers
    assert report.replaced[next(k for k in report.replaced if k.startswith(f"linear layers quantized {scheme}"))] \
        == 7 * layers
    assert report.replaced[llmk.patching.FUSED_REPORT] == 2 * layers
    counter = OpCounter(monkeypatch, ("quantized_linear",))
    got = _generate(model, ids, mask)
    assert counter.calls["quantized_linear"] == 4 * layers * (1 + (NEW - 1 if device == "cpu" else 2))
    llmk.unpatch(model)  # nn.Linear layers of the dequantized weights: the reference
    assert not any(isinstance(m, llmk.quantization.QuantizedLinear) or "_llmk_qkv" in m.__dict__
                   for m in model.modules())
    want = _generate(model, ids, mask)
    assert_generation_follows(got, want, TOLERANCE, f"{family} {scheme} on {device}")
