"""llmk.patch / llmk.unpatch on tiny Hugging Face models of every supported family (random
weights from the real architectures' configs): patched logits against the unpatched model,
a few training steps against its loss curve, patch/unpatch round trips, torch.compile, and
configs llmk cannot compute left unpatched with their reason."""

import copy
import sys

import pytest
import torch

import llmk
from conftest import DEVICES

transformers = pytest.importorskip("transformers")
from hf_models import OpCounter, tiny_model  # noqa: E402 (needs transformers)

patching = sys.modules["llmk.patching"]

PATCH_OPS = ("attention", "rope", "rmsnorm", "add_rmsnorm", "swiglu", "geglu")


def _model(family, device, dtype, **overrides):
    return tiny_model(family, device, dtype, **overrides)


def _Counter(monkeypatch, names=PATCH_OPS):
    return OpCounter(monkeypatch, names)


FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "gpt_oss"]
# bf16 logits of two models that round differently (llmk rounds once where the model rounds
# two or three times) differ by a few bf16 steps of the largest logit.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 4e-2}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", FAMILIES)
def test_patched_logits_match_the_model(family, dtype, device, monkeypatch):
    model = _model(family, device, dtype)
    ids = torch.randint(0, 256, (2, 37), device=device)
    with torch.no_grad():
        want = model(ids).logits.float()
    report = llmk.patch(model, attention=True)
    counter = _Counter(monkeypatch)
    with torch.no_grad():
        got = model(ids).logits.float()
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err <= TOLERANCE[dtype], f"{family} {dtype}: max rel err {err:.3g}\n{report}"
    layers = model.config.num_hidden_layers
    assert counter.calls["add_rmsnorm"] == layers and counter.calls["rope"] == layers
    assert counter.calls["rmsnorm"] >= layers + 1  # input norms and the final norm (and q/k norms)
    if family == "gpt_oss":  # a mixture of experts: the model's own
        assert "experts" in report.left["mlp"]
    else:
        gate = "geglu" if family.startswith("gemma") else "swiglu"  # Gemma's MLP gates with GELU-tanh
        assert counter.calls[gate] == layers and "mlp" not in report.left
    # llmk attention computes fp16/bf16 calls, the sliding-window layers (Gemma 3's and
    # gpt-oss's windows of 16 < 37 tokens) and gpt-oss's sinks included where it takes them (on
    # CUDA the Hopper forward, which has no head dim 32: those layers run the model's attention).
    assert counter.calls["attention"] == (_llmk_attention_layers(model, device, 37) if dtype == torch.bfloat16 else 0)
    llmk.unpatch(model)


def _llmk_attention_layers(model, device, seq) -> int:
    """The layers whose attention llmk computes on `device` for a sequence of `seq` tokens: all,
    but those with a score variant (a window shorter than seq, soft-capping, sinks) where llmk
    does not take the variants for the model's head dim."""
    takes = patching.variants_run_on(torch.device(device), patching.model_head_dim(model.config))
    count = 0
    for layer in model.model.layers:
        attn = layer.self_attn
        window = getattr(attn, "sliding_window", getattr(model.config, "sliding_window", None))
        variant = ((window is not None and window < seq) or getattr(attn, "attn_logit_softcapping", None) is not None
                   or getattr(attn, "sinks", None) is not None)
        count += takes or not variant
    return count


# (family, config overrides, the score variants each layer's call must carry)
VARIANT_MODELS = [
    ("gemma2", dict(attn_logit_softcapping=50.0, sliding_window=8), ("softcap", "window")),
    ("mistral", dict(sliding_window=8), ("window",)),
    ("gemma3", {}, ("window",)),
    ("gpt_oss", {}, ("sinks", "window")),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family,overrides,variants", VARIANT_MODELS, ids=[v[0] for v in VARIANT_MODELS])
def test_score_variants_run_on_llmk_attention(family, overrides, variants, device, monkeypatch):
    """Sliding windows shorter than the sequence, Gemma 2's soft-capping and gpt-oss's sinks reach
    llmk.attention (no mask materialized: the window travels as a keyword), and a padded batch,
    whose mask llmk does not take, falls back to the model's attention (eager where the call has
    soft-capping or sinks) with the same logits as the unpatched model."""
    model = _model(family, device, torch.bfloat16, head_dim=64, **overrides)  # a head dim of the Hopper forward
    if not patching.variants_run_on(torch.device(device), 64):
        pytest.skip("llmk takes the score variants on the CPU and the Hopper forward only")
    ids = torch.randint(1, 256, (2, 37), device=device)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    with torch.no_grad():
        want = model(ids).logits.float()
        want_padded = model(ids, attention_mask=mask).logits.float()
    llmk.patch(model, attention=True)
    seen = []
    original = llmk.ops.attention

    def attention(*args, **kwargs):
        seen.append({k for k in ("window", "softcap", "sinks") if kwargs.get(k) is not None})
        return original(*args, **kwargs)

    monkeypatch.setattr(llmk.ops, "attention", attention)
    with torch.no_grad():
        got = model(ids).logits.float()
        got_padded = model(ids, attention_mask=mask).logits.float()
    llmk.unpatch(model)
    layers = model.config.num_hidden_layers
    assert len(seen) == layers, seen  # the padded batch's calls went to the model's attention
    assert set().union(*seen) == set(variants), seen
    for g, w, what in ((got, want, "unpadded"), (got_padded[1, 5:], want_padded[1, 5:], "padded")):
        err = ((g - w).abs().max() / w.abs().max()).item()
        assert err <= TOLERANCE[torch.bfloat16], f"{family} {what}: max rel err {err:.3g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_prefill_and_decode_with_a_static_cache(family, device):
    """A prefill into an empty StaticCache reaches attention with no mask and keys the length
    of the whole cache (transformers means the first seq_q of them); decode steps then carry
    the cache's mask (SDPA computes them)."""
    model = _model(family, device, torch.bfloat16)
    ids = torch.randint(0, 256, (1, 19), device=device)

    def run():
        cache = transformers.StaticCache(config=model.config, max_cache_len=48)
        with torch.no_grad():
            first = model(ids, past_key_values=cache, use_cache=True).logits[:, -1].float()
            step = model(ids[:, -1:], past_key_values=cache, use_cache=True,
                         cache_position=torch.tensor([19], device=device)).logits[:, -1].float()
        return first, step

    want = run()
    llmk.patch(model, attention=True)
    got = run()
    llmk.unpatch(model)
    for g, w in zip(got, want):
        assert ((g - w).abs().max() / w.abs().max()).item() <= TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_training_follows_the_unpatched_loss_curve(family, device, monkeypatch):
    model = _model(family, device, torch.float32).train()
    twin = copy.deepcopy(model)
    report = llmk.patch(model, attention=True)
    assert "training mode" in report.left["attention"]
    counter = _Counter(monkeypatch, names=("cross_entropy",))
    ids = torch.randint(0, 256, (2, 33), device=device)
    losses = []
    for m in (model, twin):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        curve = []
        for _ in range(4):
            loss = m(ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            curve.append(loss.item())
        losses.append(curve)
    assert counter.calls["cross_entropy"] == 4  # the loss ran on llmk.cross_entropy
    assert losses[0][-1] < losses[0][0]
    for got, want in zip(*losses):
        assert abs(got - want) <= 1e-4 * abs(want), losses


@pytest.mark.parametrize("family", FAMILIES)
def test_patch_unpatch_round_trip(family):
    model = _model(family, "cpu", torch.bfloat16)
    modeling = sys.modules[type(model).__module__]
    rotary, implementation = modeling.apply_rotary_pos_emb, model.config._attn_implementation
    ids = torch.randint(0, 256, (1, 21))
    with torch.no_grad():
        want = model(ids).logits
    state = {k: v.clone() for k, v in model.state_dict().items()}
    llmk.patch(model)
    assert modeling.apply_rotary_pos_emb is not rotary and model.config._attn_implementation == "llmk"
    with pytest.raises(ValueError, match="already patched"):
        llmk.patch(model)
    llmk.unpatch(model)
    assert modeling.apply_rotary_pos_emb is rotary and model.config._attn_implementation == implementation
    assert not any("forward" in m.__dict__ for m in model.modules()) and "_loss_function" not in model.__dict__
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="not patched"):
        llmk.unpatch(model)


def test_rotary_function_stays_patched_while_another_model_of_the_family_is():
    a, b, c = (_model("llama", "cpu", torch.float32) for _ in range(3))
    modeling = sys.modules[type(a).__module__]
    rotary = modeling.apply_rotary_pos_emb
    for m in (a, b, c):
        llmk.patch(m)
    llmk.unpatch(a)
    assert modeling.apply_rotary_pos_emb is not rotary
    del b  # a patched model that is garbage collected releases the function too
    llmk.unpatch(c)
    assert modeling.apply_rotary_pos_emb is rotary


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])  # gemma3: windows shorter than the sequence
def test_compile_fullgraph(family):
    model = _model(family, "cpu", torch.bfloat16)
    ids = torch.randint(0, 256, (1, 24))
    llmk.patch(model)
    with torch.no_grad():
        want = model(ids).logits
        torch._dynamo.reset()
        got = torch.compile(model, fullgraph=True, backend="aot_eager")(ids).logits
    # aot_eager decomposes the model's own bf16 ops (its linears, embedding, residual adds)
    # with other roundings: compare as the bf16 logits test does.
    err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
    assert err <= TOLERANCE[torch.bfloat16], err
    llmk.unpatch(model)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_by_default_only_where_llmk_is_faster(device):
    model = _model("llama", device, torch.bfloat16)
    report = llmk.patch(model)
    hopper = device == "cuda" and torch.cuda.get_device_capability()[0] == 9
    assert ("cuDNN" in report.left.get("attention", "")) == hopper
    assert model.config._attn_implementation == ("sdpa" if hopper else "llmk")
    llmk.unpatch(model)
    # soft-capping and sinks, which SDPA does not compute: llmk's attention everywhere
    for family, overrides in (("gemma2", dict(attn_logit_softcapping=50.0)), ("gpt_oss", {})):
        model = _model(family, device, torch.bfloat16, head_dim=64, **overrides)
        report = llmk.patch(model)
        assert "attention" not in report.left and model.config._attn_implementation == "llmk", report
        llmk.unpatch(model)


def test_what_llmk_cannot_compute_is_left_with_its_reason():
    odd = _model("llama", "cpu", torch.bfloat16, head_dim=40)
    assert "head_dim 40" in llmk.patch(odd).left["attention"]
    llmk.unpatch(odd)
    only_norms = _model("llama", "cpu", torch.float32)
    report = llmk.patch(only_norms, rope=False, mlp=False, attention=False, cross_entropy=False)
    assert set(report.left) >= {"rope", "mlp", "attention", "cross_entropy"} and report.replaced["rmsnorm modules"] == 5
    llmk.unpatch(only_norms)
    assert "float16/bfloat16" in llmk.patch(only_norms, linear=True).left["linear"]
    llmk.unpatch(only_norms)
    with pytest.raises(ValueError, match="decode=True cannot serve this model: the model is torch.float32"):
        llmk.patch(only_norms, decode=True)
    with pytest.raises(ValueError, match="model type 'gpt2' is not supported"):
        llmk.patch(transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2)))
