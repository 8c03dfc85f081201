"""``llmk.patch(model)``: a Hugging Face transformers (5.x) causal LM of the Llama, Qwen2,
Qwen3, Mistral, Gemma 2/3 or gpt-oss family running on llmk kernels, and ``llmk.unpatch(model)``.

What is replaced, each part only where llmk computes exactly what the model computes:

- RMSNorm modules (``*RMSNorm``, Gemma's ``1 + weight`` as ``offset=1``) run ``llmk.rmsnorm``;
  per-head q/k norms (Qwen3, Gemma 3) included.
- Decoder layers: the residual add before the MLP's norm (Llama-like: ``post_attention_layernorm``,
  Gemma: ``pre_feedforward_layernorm``) is fused into it with ``llmk.add_rmsnorm``.
- The rotary application: the family's ``apply_rotary_pos_emb`` runs ``llmk.rope`` with the
  model's own cos/sin (so every rope scaling the model has is honoured); this is a function of
  the family's modeling module, so it applies to every model of that family in the process
  until the last patched one is unpatched (numerically the same rotation).
- The gated MLP runs ``llmk.swiglu`` (SiLU gate) or ``llmk.geglu`` (Gemma's GELU gate, erf or
  tanh) over its two projections (gpt-oss's mixture of experts stays the model's).
- The causal LM loss (transformers' ForCausalLMLoss) runs ``llmk.cross_entropy`` on the
  logits as they are, without their fp32 copy.
- Attention goes through transformers' AttentionInterface as ``"llmk"``: ``llmk.attention``
  for calls it computes (fp16/bf16, no attention mask beyond causal, no dropout, eval mode), with
  the layer's sliding window (Mistral, Gemma 2/3, gpt-oss), logit soft-capping (Gemma 2) and
  sinks (gpt-oss) where llmk computes those (the CPU backend; on CUDA the Hopper forward's head
  dims); a sliding-window layer's mask is not materialized where the window is its
  only difference from causal (transformers' ``sdpa_mask`` otherwise). Every other call goes to
  the model's own attention: SDPA, or the family's eager attention where it has soft-capping or
  sinks (which SDPA does not compute). A model in
  training mode keeps SDPA: llmk's attention backward exists, but a training step's forward +
  backward is not ahead of cuDNN's (Hopper) and FlashAttention 2's (sm_80) at every shape
  (docs/benchmarks.md has the numbers). By default (``attention=None``) a model on a Hopper GPU
  keeps SDPA too: there SDPA runs cuDNN's attention, which llmk's Hopper forward does not beat at
  every shape yet; ``attention=True`` patches it anyway. A model with soft-capping (Gemma 2) or
  sinks (gpt-oss), which SDPA does not compute (the model runs its eager attention), takes
  llmk's attention by default on Hopper too.

- Generation (``decode=True``): ``model.generate(...)`` runs on llmk's own KV cache
  (:class:`llmk.generation.KVCache`, made per ``generate`` call from its batch size and
  ``max_length`` and kept for later calls it fits): the prefill through ``llmk.attention``, each
  decode step through one ``llmk.attention_decode`` per layer (RoPE and the cache append in the
  same launch), and on CUDA the one-token steps replayed from a CUDA graph. Every family above,
  each layer's window, soft-capping and sinks applied by the prefill and decode kernels
  (Gemma 3's two rotary tables, Gemma 2's final logit soft-capping included).
  ``kv_cache_dtype=torch.float8_e4m3fn`` stores the
  cache in fp8 with per-head scales; ``kv_page_size`` reads it through a block table.

A model that transformers loaded tensor-parallel (its ``tp_plan``) is patched the same way: each
rank's ops run on its local tensors, and ``decode=True``'s cache holds the rank's kv heads.

The report returned says what was replaced and what was left and why. Nothing is copied:
the patched model shares its parameters and state dict with the original, and works under
``torch.compile(fullgraph=True)``; every replaced part trains through autograd.
"""

import sys
import types
import weakref
from dataclasses import dataclass, field
from typing import Dict, Optional

import torch

from . import _C, ops, quantization, tensor_parallel
from .ops.activation import GATED_OPS, MODEL_ACTIVATIONS

# model_type -> (family, norm offset, the decoder layer's norm that follows the first residual add)
FAMILIES = {
    "llama": ("llama", 0.0, "post_attention_layernorm"),
    "mistral": ("mistral", 0.0, "post_attention_layernorm"),
    "qwen2": ("qwen2", 0.0, "post_attention_layernorm"),
    "qwen3": ("qwen3", 0.0, "post_attention_layernorm"),
    "gemma2": ("gemma2", 1.0, "pre_feedforward_layernorm"),
    "gemma3_text": ("gemma3", 1.0, "pre_feedforward_layernorm"),
    "gpt_oss": ("gpt_oss", 0.0, "post_attention_layernorm"),
}
_ATTENTION_NAME = "llmk"


@dataclass
class PatchReport:
    """What :func:`patch` replaced (part -> count) and left (part -> reason)."""
    model_type: str
    replaced: Dict[str, int] = field(default_factory=dict)
    left: Dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"llmk.patch ({self.model_type}):"]
        lines += [f"  replaced {part}: {count}" for part, count in self.replaced.items()]
        lines += [f"  left {part}: {reason}" for part, reason in self.left.items()]
        return "\n".join(lines)


def patch(model: torch.nn.Module, *, rmsnorm: bool = True, rope: bool = True, mlp: bool = True,
          attention: Optional[bool] = None, linear: bool = False, cross_entropy: bool = True,
          decode: bool = False, kv_cache_dtype: Optional[torch.dtype] = None,
          kv_page_size: Optional[int] = None, quantize: Optional[str] = None) -> PatchReport:
    """Runs `model` (a transformers causal LM of a supported family, on any device) on llmk
    kernels; returns the :class:`PatchReport`. ``linear=True`` runs every nn.Linear of the
    model on llmk.linear (off by default: it is not ahead of cuBLAS at every prefill size,
    docs/benchmarks.md "GEMM"). ``decode=True`` runs ``generate`` on llmk's KV cache and decode
    kernels (``kv_cache_dtype``: the model's dtype or ``torch.float8_e4m3fn``; ``kv_page_size``:
    a paged cache); a model it cannot serve is rejected with the reason. ``quantize``
    ("int4-g128", "int4", "int8", ...: :func:`llmk.quantization.quantize_model`'s schemes)
    replaces the decoder's nn.Linear layers by llmk.quantized_linear on their round-to-nearest
    quantized weights (the lm_head stays); unpatch puts back nn.Linear layers holding the
    dequantized weights. A model's quantized q/k/v and gate/up layers (``quantize``'s, or a
    GPTQ / AWQ checkpoint's from :func:`llmk.quantization.load_quantized_state_dict`) run as
    one launch each."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", type(model).__name__)
    if model_type not in FAMILIES:
        raise ValueError(f"llmk.patch: model type {model_type!r} is not supported; supported: "
                         f"{', '.join(sorted(FAMILIES))}")
    if getattr(model, "_llmk_patch", None) is not None:
        raise ValueError("llmk.patch: the model is already patched (llmk.unpatch(model) first)")
    if decode:
        generation = _generation()
        reason = generation.unsupported(model)
        if reason:
            raise ValueError(f"llmk.patch: decode=True cannot serve this model: {reason}")
        reason = generation.cache_options_error(next(model.parameters()).dtype, kv_cache_dtype, kv_page_size,
                                                "kv_cache_dtype", "kv_page_size")
        if reason:
            raise ValueError(f"llmk.patch: {reason}")
    elif kv_cache_dtype is not None or kv_page_size is not None:
        raise ValueError("llmk.patch: kv_cache_dtype and kv_page_size configure decode=True's cache; pass decode=True")
    if quantize is not None:
        quantization.parse_scheme(quantize)  # a bad scheme is rejected before anything changes
    family, offset, fused_norm = FAMILIES[model_type]
    report = PatchReport(model_type)
    state = {"rope": None, "attn_implementation": None, "loss_function": None, "decode": None, "quantized": False}
    if rmsnorm:
        report.replaced["rmsnorm modules"] = _patch_norms(model, offset)
        layers = _patch_layers(model, fused_norm, offset)
        report.replaced["residual add + rmsnorm (decoder layers)"] = len(layers)
        if fused_norm == "post_attention_layernorm":  # Gemma normalizes attention's output before its add
            tp_layers = tensor_parallel.patch_layers(model, layers, _replace_forward, _norm_eps)
            if tp_layers:
                report.replaced["tensor-parallel all-reduce + residual add + rmsnorm (decoder layers)"] = tp_layers
    else:
        report.left["rmsnorm"] = "rmsnorm=False"
    if rope:
        # The family's function is restored with the last patched model: by unpatch, or when
        # the model is garbage collected.
        state["rope"] = weakref.finalize(model, _unpatch_rope, _patch_rope(type(model).__module__))
        report.replaced["rotary application (apply_rotary_pos_emb)"] = 1
    else:
        report.left["rope"] = "rope=False"
    act = getattr(config, "hidden_act", None) or getattr(config, "hidden_activation", None)
    if not mlp:
        report.left["mlp"] = "mlp=False"
    elif act in MODEL_ACTIVATIONS:
        gate_op, gate_args = _gate(act)
        count = _patch_mlps(model, gate_op, gate_args)
        if count:
            report.replaced[f"gated MLP ({gate_op})"] = count
        else:
            report.left["mlp"] = ("no gated MLP with gate_proj / up_proj / down_proj (a mixture of experts, as "
                                  "gpt-oss's, runs as the model's)")
    else:
        report.left["mlp"] = f"the {act!r} gate has no llmk kernel ({', '.join(MODEL_ACTIVATIONS)})"
    if attention is None and _on_hopper(model) and not _scores_sdpa_lacks(model):
        report.left["attention"] = ("on Hopper, SDPA runs cuDNN's attention, which llmk's Hopper forward does not "
                                    "beat at every sequence length yet: attention=True patches it anyway")
    elif attention is not False:
        reason = _attention_unsupported(config, model.training, next(model.parameters()).device)
        if reason:
            report.left["attention"] = reason
        else:
            state["attn_implementation"] = config._attn_implementation
            variants_run_on(next(model.parameters()).device, model_head_dim(config))  # known before any trace
            _use_llmk_attention(model)
            report.replaced["attention (AttentionInterface 'llmk')"] = config.num_hidden_layers
            report.left["attention calls"] = (
                "the model's attention computes calls llmk cannot: an attention mask beyond causal (padding, "
                "a static cache), dropout, training, fp32")
    else:
        report.left["attention"] = "attention=False"
    if quantize is not None:
        done = quantization.quantize_model(model, quantize)
        state["quantized"] = True
        mib = f"{done['bytes_before'] / 2**20:.0f} -> {done['bytes_after'] / 2**20:.0f} MiB of weights"
        report.replaced[f"linear layers quantized {quantize} (llmk.quantized_linear; {mib})"] = len(done["quantized"])
        if done["skipped"]:
            report.left["quantize"] = "; ".join(f"{name}: {why}" for name, why in done["skipped"].items())
    fused = _fuse_quantized(model)  # quantize's layers, or a checkpoint's (load_quantized_state_dict)
    if fused:
        report.replaced[FUSED_REPORT] = fused
    if not linear:
        report.left["linear"] = "linear=False (cuBLAS through nn.Linear)"
    else:
        reason = _patch_linears(model)
        if isinstance(reason, str):
            report.left["linear"] = reason
        else:
            report.replaced["linear layers (llmk.linear)"] = reason
    if not cross_entropy:
        report.left["cross_entropy"] = "cross_entropy=False"
    else:
        reason = _patch_loss(model, state)
        if reason:
            report.left["cross_entropy"] = reason
        else:
            report.replaced["causal LM loss (cross_entropy, no fp32 copy of the logits)"] = 1
    if decode:
        report.replaced["generation (llmk.KVCache: prefill llmk.attention, steps llmk.attention_decode"
                        + (", CUDA graph" if next(model.parameters()).is_cuda else "") + ")"] = \
            _patch_generation(model, state, kv_cache_dtype, kv_page_size)
    else:
        report.left["decode"] = "decode=False (generate keeps transformers' cache and attention)"
    model._llmk_patch = state
    return report


def unpatch(model: torch.nn.Module) -> None:
    """Restores a model :func:`patch` changed."""
    state = getattr(model, "_llmk_patch", None)
    if state is None:
        raise ValueError("llmk.unpatch: the model is not patched")
    for module in model.modules():
        if getattr(module.__dict__.get("forward"), "_llmk", False):
            del module.forward
            if "_llmk_previous_forward" in module.__dict__:
                module.forward = module.__dict__.pop("_llmk_previous_forward")
        for attr in ("_llmk_tp", "_llmk_defer", "_llmk_normed_input"):
            module.__dict__.pop(attr, None)
    if state["rope"] is not None:
        state["rope"]()
    if state["attn_implementation"] is not None:
        model.set_attn_implementation(state["attn_implementation"])
    for module in model.modules():
        for attr, _ in FUSED_PROJECTIONS:
            module.__dict__.pop(attr, None)
    if state["quantized"]:
        _dequantize_linears(model)
    if state["decode"] is not None:
        model.__dict__.pop("_prepare_cache_for_generation", None)
        state["decode"].cache = None
    if state["loss_function"] is not None:
        previous = state["loss_function"][0]
        if previous is None:
            del model._loss_function
        else:
            model._loss_function = previous
    model._llmk_patch = None


def _replace_forward(module: torch.nn.Module, fn) -> None:
    fn._llmk = True  # what unpatch looks for (a bound method shows its function's attributes)
    previous = module.__dict__.get("forward")  # a forward installed on the module (a TP plan's)
    if previous is not None:
        module._llmk_previous_forward = previous
    module.forward = types.MethodType(fn, module)


# -- RMSNorm modules and the decoder layers' fused residual add ---------------------------


def _norm_eps(norm: torch.nn.Module) -> float:
    return getattr(norm, "variance_epsilon", None) or getattr(norm, "eps")


def _rmsnorm_any_layout(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    """llmk.rmsnorm over the last dim of x in any layout with a contiguous last dim: a
    transposed view (Gemma 3 normalizes q and k as [batch, heads, seq, dim] views of
    [batch, seq, heads, dim] projections) is normalized as the rows it is in memory, and the
    result keeps x's layout."""
    if x.is_contiguous() or x.dim() < 3:
        return ops.rmsnorm(x, weight, eps, offset)
    order = sorted(range(x.dim() - 1), key=lambda i: -x.stride(i)) + [x.dim() - 1]
    inverse = sorted(range(x.dim()), key=order.__getitem__)
    return ops.rmsnorm(x.permute(order), weight, eps, offset).permute(inverse)


def _patch_norms(model: torch.nn.Module, offset: float) -> int:
    count = 0
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm") and getattr(module, "weight", None) is not None:
            eps = _norm_eps(module)

            def forward(self, x, _eps=eps):
                return _rmsnorm_any_layout(x, self.weight, _eps, offset)

            _replace_forward(module, forward)
            count += 1
    return count


def _patch_layers(model: torch.nn.Module, fused_norm: str, offset: float) -> list:
    """Decoder layers: ``h = residual + attn; norm(h)`` as one ``add_rmsnorm``. The Llama-like
    layer is input_layernorm, attention, [add + post_attention_layernorm], MLP, add; Gemma's
    puts post_attention_layernorm on the attention output and fuses the add into
    pre_feedforward_layernorm, with post_feedforward_layernorm on the MLP output. A layer that
    tensor_parallel.patch_layers marks runs its own forward at inference. Returns the layers."""
    layers = []
    for layer in model.modules():
        norm = getattr(layer, fused_norm, None)
        if norm is None or not hasattr(layer, "self_attn") or not hasattr(layer, "mlp"):
            continue
        eps = _norm_eps(norm)
        gemma = fused_norm == "pre_feedforward_layernorm"

        def forward(self, hidden_states, *args, _eps=eps, _gemma=gemma, **kwargs):
            if args:  # the models call their layers with keywords; anything else runs the original
                return type(self).forward(self, hidden_states, *args, **kwargs)
            if "_llmk_tp" in self.__dict__ and not torch.is_grad_enabled():
                return tensor_parallel.layer_forward(self, hidden_states, kwargs, _eps, offset)
            attn, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
            if _gemma:
                attn = self.post_attention_layernorm(attn)
            weight = getattr(self, fused_norm).weight
            normed, residual = ops.add_rmsnorm(attn, hidden_states, weight, _eps, offset)
            out = self.mlp(normed)
            if isinstance(out, tuple):  # gpt-oss's experts return (out, router scores)
                out = out[0]
            if _gemma:
                out = self.post_feedforward_layernorm(out)
            return residual + out

        _replace_forward(layer, forward)
        layers.append(layer)
    return layers


# -- rotary application -------------------------------------------------------------------

_ROPE_PATCHED: Dict[str, list] = {}  # modeling module name -> [original function, patched models]


def _patch_rope(module_name: str) -> str:
    modeling = sys.modules[module_name]
    entry = _ROPE_PATCHED.get(module_name)
    if entry is None:
        original = modeling.apply_rotary_pos_emb
        entry = _ROPE_PATCHED[module_name] = [original, 0]
        modeling.apply_rotary_pos_emb = _llmk_rotary(original)
    entry[1] += 1
    return module_name


def _unpatch_rope(module_name: str) -> None:
    entry = _ROPE_PATCHED[module_name]
    entry[1] -= 1
    if entry[1] == 0:
        sys.modules[module_name].apply_rotary_pos_emb = entry[0]
        del _ROPE_PATCHED[module_name]


def _llmk_rotary(original):
    """apply_rotary_pos_emb(q, k, cos, sin) on llmk.rope: q, k [batch, heads, seq, head_dim];
    cos, sin [batch or 1, seq, head_dim] as the model computed them (NeoX halves: cos[..., :d/2]
    repeats in cos[..., d/2:]), or [batch or 1, seq, head_dim / 2] (gpt-oss: the halves' angles
    once), which become a per-token cos/sin cache."""

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        dim = q.shape[-1]
        if unsqueeze_dim != 1 or cos.dim() != 3 or cos.shape[-1] not in (dim, dim // 2):
            return original(q, k, cos, sin, unsqueeze_dim)
        batch, seq, half = cos.shape[0], cos.shape[1], dim // 2
        cache = torch.cat([cos[..., :half], sin[..., :half]], dim=-1).reshape(batch * seq, dim)
        positions = torch.arange(batch * seq, device=q.device).view(batch, seq) if batch > 1 else \
            torch.arange(seq, device=q.device)
        q_out, k_out = ops.rope(q.transpose(1, 2), k.transpose(1, 2), positions, cache.float())
        return q_out.transpose(1, 2), k_out.transpose(1, 2)

    return apply_rotary_pos_emb


# -- gated MLP ----------------------------------------------------------------------------


def _gate(act: str):
    """The llmk gated op of a model's activation name, and its arguments after (gate, up):
    swiglu(gate, up), or geglu(gate, up, approximate)."""
    fn, approximate = MODEL_ACTIVATIONS[act]
    return GATED_OPS[fn], (approximate,) if approximate is not None else ()


def _patch_mlps(model: torch.nn.Module, gate_op: str, gate_args: tuple) -> int:
    def forward(self, x):
        gate_up = self.__dict__.get("_llmk_gate_up")  # quantize's fused projection (_fuse_quantized)
        if gate_up is not None:
            h = gate_up(x)
            n = h.shape[-1] // 2
            return self.down_proj(getattr(ops, gate_op)(h[..., :n], h[..., n:], *gate_args))
        return self.down_proj(getattr(ops, gate_op)(self.gate_proj(x), self.up_proj(x), *gate_args))

    count = 0
    for module in model.modules():
        if all(hasattr(module, p) for p in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            _replace_forward(module, forward)
            count += 1
    return count


def _patch_linears(model: torch.nn.Module):
    """Every nn.Linear's forward on llmk.linear (the module, its parameters and hooks stay);
    the count, or why none was patched (llmk.linear takes fp16/bf16 weights)."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if any("forward" in m.__dict__ for m in linears):
        return ("the model's nn.Linear layers run transformers' tensor-parallel forward (sharded weights, its "
                "all-reduce); llmk.linear takes whole weights")
    dtypes = {m.weight.dtype for m in linears}
    if not dtypes <= {torch.float16, torch.bfloat16}:
        return f"llmk.linear takes float16/bfloat16 weights; this model has {sorted(map(str, dtypes))}"

    def forward(self, x):
        return ops.linear(x, self.weight, self.bias)

    for module in linears:
        _replace_forward(module, forward)
    return len(linears)


# (module attribute, the projections it fuses): decode=True's attention forward and the gated
# MLP's forward run the fused one when the module has it.
FUSED_REPORT = ("quantized q/k/v and gate/up projections fused (one launch each: the gated MLP, "
                "decode=True attention)")
FUSED_PROJECTIONS = (("_llmk_qkv", ("q_proj", "k_proj", "v_proj")), ("_llmk_gate_up", ("gate_proj", "up_proj")))


def _fuse_quantized(model: torch.nn.Module) -> int:
    """quantize's q/k/v and gate/up QuantizedLinear layers of each module as one (views of its
    rows stay the layers' buffers), kept outside the module tree; the count of fused sets."""
    count = 0
    for module in model.modules():
        for attr, names in FUSED_PROJECTIONS:
            parts = [getattr(module, n, None) for n in names]
            if all(isinstance(p, quantization.QuantizedLinear) for p in parts):
                fused = quantization.fuse_rows(parts)
                if fused is not None:
                    module.__dict__[attr] = fused  # not a submodule: state_dict and modules() unchanged
                    count += 1
    return count


def _dequantize_linears(model: torch.nn.Module) -> None:
    """unpatch of ``quantize``: each QuantizedLinear back to an nn.Linear of its dequantized weight."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, quantization.QuantizedLinear):
                linear = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                         device="meta")
                linear.weight = torch.nn.Parameter(child.dequantize(), requires_grad=False)
                if child.bias is not None:
                    linear.bias = child.bias
                setattr(parent, name, linear)


# -- generation ----------------------------------------------------------------------------


def _generation():
    from . import generation  # needs transformers, which llmk itself does not

    return generation


def _patch_generation(model: torch.nn.Module, state: dict, cache_dtype, page_size) -> int:
    """The attention modules and the causal LM's forward through a KVCache when they get one,
    and generate's cache preparation making one; the count of attention modules."""
    generation = _generation()
    caches = state["decode"] = generation.Caches(cache_dtype, page_size)
    modules = generation.attention_modules(model)
    for module in modules:
        _replace_forward(module, generation.attention_forward)
    _replace_forward(model, generation.causal_lm_forward)
    model._prepare_cache_for_generation = types.MethodType(caches.prepare, model)
    return len(modules)


# -- the causal LM loss ---------------------------------------------------------------------


def _causal_lm_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None,
                    **kwargs):
    """transformers' ForCausalLMLoss on llmk.cross_entropy: the same shift and reductions,
    without the fp32 copy of the logits (llmk's math is fp32 on the logits' own dtype)."""
    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    target = shift_labels.reshape(-1).to(logits.device)
    if num_items_in_batch is None:
        return ops.cross_entropy(logits.reshape(-1, vocab_size), target, ignore_index, reduction="mean")
    loss = ops.cross_entropy(logits.reshape(-1, vocab_size), target, ignore_index, reduction="sum")
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def _patch_loss(model: torch.nn.Module, state: dict) -> str:
    from transformers.loss.loss_utils import ForCausalLMLoss

    if model.loss_function is not ForCausalLMLoss:
        return f"the model's loss is {getattr(model.loss_function, '__name__', model.loss_function)}, not ForCausalLMLoss"
    state["loss_function"] = (model.__dict__.get("_loss_function"),)
    model.loss_function = _causal_lm_loss
    return ""


# -- attention ----------------------------------------------------------------------------

_SDPA = []  # transformers' sdpa_attention_forward, once attention is first patched


def _on_hopper(model: torch.nn.Module) -> bool:
    device = next(model.parameters()).device
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


def _scores_sdpa_lacks(model: torch.nn.Module) -> bool:
    """Whether the model's attention has logit soft-capping (Gemma 2) or sinks (gpt-oss), which
    SDPA does not compute (the model then runs its eager attention, every score in memory):
    there llmk's attention is the fast path, and patch(attention=None) takes it on Hopper too."""
    generation = _generation()
    return any(v["softcap"] is not None or v["sinks"] is not None
               for v in map(generation.score_variants, generation.attention_modules(model)))


def model_head_dim(config) -> int:
    """A transformers config's attention head dim (its own, else hidden / heads)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _attention_unsupported(config, training: bool, device: torch.device) -> str:
    if training:
        return ("the model is in training mode: a training step's attention stays on SDPA (llmk's forward + "
                "backward is not ahead of cuDNN's and FlashAttention 2's at every shape)")
    head_dim = model_head_dim(config)
    supported = _C.attention_head_dims()
    if head_dim not in supported:
        return f"head_dim {head_dim} has no llmk kernel ({', '.join(map(str, supported))})"
    if device.type == "cuda" and not _C.attention_head_dim_compiled(head_dim):
        return f"head_dim {head_dim} has no CUDA kernel in this build (CMake's LLMK_HEAD_DIMS)"
    return ""


_VARIANTS_RUN_ON: Dict[tuple, bool] = {}  # (device type, index, head dim) -> variants_run_on


def variants_run_on(device: torch.device, head_dim: int) -> bool:
    """Whether llmk.attention computes the score variants for `head_dim` on `device`: the CPU
    backend, or on CUDA the Hopper forward (an sm_90 GPU, an sm_90a build, its head dims).
    Remembered in a plain dict that patch() fills for the model's device: under torch.compile
    the attention's call is then a lookup, not a query of the device and the build."""
    key = (device.type, device.index, head_dim)
    known = _VARIANTS_RUN_ON.get(key)
    if known is None:
        if device.type != "cuda":
            known = True
        else:
            index = device.index if device.index is not None else torch.cuda.current_device()
            known = (torch.cuda.get_device_capability(index) == (9, 0) and "90a" in _C.build_cuda_archs().split(";")
                     and head_dim in _C.attention_sm90_head_dims())
        _VARIANTS_RUN_ON[key] = known
    return known


def _score_variants(kwargs) -> dict:
    """llmk.attention's window / softcap / sinks from the keywords transformers' attention
    modules pass: sliding_window (Mistral, Gemma 2/3, gpt-oss), softcap (Gemma 2), s_aux
    (gpt-oss's sinks, a parameter of the model's dtype; llmk takes them in float32)."""
    sinks = kwargs.get("s_aux")
    return dict(window=kwargs.get("sliding_window"), softcap=kwargs.get("softcap"),
                sinks=None if sinks is None else sinks.float())


def _llmk_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                    **kwargs):
    """transformers' attention function signature: query [batch, heads, seq_q, dim], key/value
    [batch, heads_kv, seq_k, dim]; returns ([batch, seq_q, heads, dim], None)."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    variants = _score_variants(kwargs)
    if variants["window"] is not None and variants["window"] >= key.shape[2]:
        variants["window"] = None  # a window of every key is plain causal
    computable = (attention_mask is None and dropout == 0.0 and not module.training
                  and query.dtype in (torch.float16, torch.bfloat16)
                  and (causal or variants["window"] is None)
                  and (not any(v is not None for v in variants.values())
                       or variants_run_on(query.device, query.shape[-1]))
                  and not kwargs.get("output_attentions", False))
    if not computable:
        return _model_attention(module, query, key, value, attention_mask, dropout, scaling, causal, **kwargs)
    q_len, k_len = query.shape[2], key.shape[2]
    if causal and q_len > 1 and k_len > q_len:
        # transformers passes no mask in one such case, a prefill into an empty static cache,
        # and means the mask aligned top-left (SDPA's): the first q_len keys, the rest empty.
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    out = ops.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=causal,
                        scale=scaling, **variants)
    return out, None


def _model_attention(module, query, key, value, attention_mask, dropout, scaling, causal, **kwargs):
    """A call llmk does not compute, as the model would: SDPA, or the family's eager attention
    where the call has soft-capping or sinks (SDPA has neither). Where _llmk_mask left a
    sliding window's mask out, it is made here (the window is in the call's keywords)."""
    window = kwargs.get("sliding_window")
    eager = kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None
    q_len, k_len = query.shape[2], key.shape[2]
    if attention_mask is None and causal and (window is not None or eager):
        if q_len > 1 and k_len > q_len:  # a prefill into an empty static cache (see _llmk_attention)
            key, value = key[:, :, :q_len], value[:, :, :q_len]
            k_len = q_len
        i = torch.arange(q_len, device=query.device).view(-1, 1) + (k_len - q_len)
        j = torch.arange(k_len, device=query.device).view(1, -1)
        keep = j <= i
        if window is not None:
            keep &= j > i - window
        attention_mask = keep.view(1, 1, q_len, k_len)
    if not eager:
        return _SDPA[0](module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                        is_causal=causal, **kwargs)
    if attention_mask is not None and attention_mask.dtype == torch.bool:  # eager adds its mask
        attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~attention_mask, torch.finfo(query.dtype).min)
    eager_attention = sys.modules[type(module).__module__].eager_attention_forward
    return eager_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def _llmk_mask(*args, **kwargs):
    """transformers' sdpa_mask, except for a sliding-window causal mask that it materializes only
    because of the window (no padding, no other pattern): None, the window then applied by the
    attention from its sliding_window keyword (llmk.attention's window, or _model_attention's
    mask)."""
    from transformers.masking_utils import _ignore_causal_mask_sdpa, prepare_padding_mask, sdpa_mask

    names = ("batch_size", "q_length", "kv_length", "q_offset", "kv_offset", "mask_function", "attention_mask")
    given = dict(zip(names, args), **kwargs)
    if (given.get("local_size") is not None and given.get("allow_is_causal_skip", True)
            and not given.get("allow_is_bidirectional_skip", False)):
        kv_length, kv_offset = given["kv_length"], given.get("kv_offset", 0)
        padding = prepare_padding_mask(given.get("attention_mask"), kv_length, kv_offset)
        if _ignore_causal_mask_sdpa(padding, given["q_length"], kv_length, given.get("q_offset", 0), kv_offset):
            return None
    return sdpa_mask(*args, **kwargs)


def _use_llmk_attention(model: torch.nn.Module) -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    _SDPA[:] = [sdpa_attention_forward]
    AttentionInterface.register(_ATTENTION_NAME, _llmk_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(_ATTENTION_NAME, _llmk_mask)
    model.set_attn_implementation(_ATTENTION_NAME)
