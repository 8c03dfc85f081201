"""Tiny Hugging Face causal LMs for the patch, generation and tensor-parallel tests: each
family's model from its real architecture's config at toy sizes, random weights from one seed,
the norm weights moved off their initial values; greedy generation and its comparison; a
counter of llmk op calls. Import after ``pytest.importorskip("transformers")``."""

import torch

import llmk

TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, vocab_size=256, max_position_embeddings=256)
# family -> (config class, model class, the family's own settings)
KINDS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(attn_logit_softcapping=None, query_pre_attn_scalar=32)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(query_pre_attn_scalar=32, sliding_window=16)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
                                                          rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                                           "beta_fast": 32.0, "beta_slow": 1.0,
                                                                           "rope_theta": 150000.0,
                                                                           "original_max_position_embeddings": 64})),
}


def perturb_norms(model) -> None:
    """Norm weights start at one (Gemma's at zero, of 1 + w): make them differ from it; gpt-oss's
    attention sinks too (they start at zero), to logits of the scores' size."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("self_attn.sinks"):
                p.copy_(torch.randn_like(p))


def tiny_model(family, device, dtype, **overrides):
    """The family's model in eval mode: TINY, the family's settings, then `overrides`; seed 0."""
    import transformers

    config_name, model_name, extra = KINDS[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**{**TINY, **extra, **overrides})
    model = getattr(transformers, model_name)(config).to(device=device, dtype=dtype).eval()
    perturb_norms(model)
    return model


def greedy(model, ids, mask, new, **kwargs):
    """``generate`` of `new` greedy tokens (no EOS unless given), as ``(new tokens, scores)``."""
    kwargs.setdefault("eos_token_id", None)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=0, **kwargs)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.scores, 1).float()


def assert_generation_follows(got, want, tolerance, what):
    """Greedy generations ``(new tokens [batch, steps], scores [batch, steps, vocab])`` agree:
    every step's scores within `tolerance` of the largest, while the tokens agree; a sequence
    may part only where the reference's top two scores are closer than the tolerance (a tie
    the rounding may break either way)."""
    (got_tokens, got_scores), (want_tokens, want_scores) = got, want
    scale = want_scores.abs().max().item()
    for b in range(want_tokens.shape[0]):
        for step in range(want_tokens.shape[1]):
            err = (got_scores[b, step] - want_scores[b, step]).abs().max().item() / scale
            assert err <= tolerance, f"{what}: sequence {b} step {step}: scores off by {err:.3g} of the largest"
            if got_tokens[b, step] != want_tokens[b, step]:
                top2 = want_scores[b, step].topk(2).values
                margin = (top2[0] - top2[1]).item() / scale
                assert margin <= tolerance, (f"{what}: sequence {b} parts at step {step} with a margin of "
                                             f"{margin:.3g} of the largest score")
                break


class OpCounter:
    """Counts the calls of the named llmk ops made through ``llmk.ops`` (what the patched
    model calls)."""

    def __init__(self, monkeypatch, names):
        self.calls = dict.fromkeys(names, 0)
        for name in names:
            original = getattr(llmk.ops, name)

            def counted(*args, _name=name, _original=original, **kwargs):
                self.calls[_name] += 1
                return _original(*args, **kwargs)

            monkeypatch.setattr(llmk.ops, name, counted)
