"""Generation on llmk: :class:`KVCache`, a transformers ``Cache`` that llmk's attention writes
itself, and the model changes of ``llmk.patch(model, decode=True)`` that route ``generate`` through
it. Imported by the patch (it needs transformers; llmk itself does not).

One forward of a patched model with a KVCache (what ``generate`` makes every step):

- **Prefill** (the cache empty: the first call of a ``generate``): the model's q/k/v projections
  (and q/k norms), ``llmk.rope`` at each sequence's own positions, ``llmk.attention`` over the
  prompt (``llmk.attention_varlen`` over the real tokens when the batch is left-padded), then one
  write of the rotated keys and the values into the cache, left-aligned: sequence b's first real
  token goes to slot 0, so the cache holds no padding and ``cache_seqlens[b]`` is b's real length.
- **Decode** (every later call, any number of new tokens): per layer ONE
  ``llmk.attention_decode``, which rotates q and the new k at positions ``cache_seqlens + i`` (the
  positions transformers computes from the attention mask), appends k/v to the cache and attends
  over it. The rest of the layer is the model's (with the rest of ``llmk.patch``: fused residual
  add + RMSNorm, the gated MLP). On CUDA a one-token step runs eagerly once, is captured in a CUDA
  graph the next time, and every later one-token step is a graph replay: no Python per layer, no
  host synchronization, no allocation (the graph owns its activations).

The attention mask and position ids ``generate`` passes are read at the prefill only (left padding,
which must be left); afterwards the cache's lengths are the truth. The model's own causal mask
builders never run.
"""

from dataclasses import dataclass
from typing import Optional

import torch
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

from . import _C, ops
from .patching import model_head_dim, variants_run_on

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
# fp8 scales: the prompt's largest |k| (|v|) of each head maps to FP8_MAX / FP8_HEADROOM, so that
# tokens generated later may grow that much before they saturate.
FP8_HEADROOM = 2.0
ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # angles that do not depend on the sequence length
CAPACITY_ROUND = 256  # cache slots are allocated in multiples of this


def unsupported(model) -> str:
    """Why ``decode=True`` cannot serve `model` ("" when it can): what the decode kernel lacks."""
    config = model.config
    if not hasattr(getattr(model, "model", None), "layers") or not hasattr(model, "lm_head"):
        return f"{type(model).__name__} is not a causal LM with model.layers and lm_head"
    devices = {p.device for p in model.parameters()}
    if len(devices) > 1 or any(d.type == "meta" for d in devices):
        return (f"the model's parameters are on {', '.join(sorted(map(str, devices)))}: the KV cache and its CUDA "
                "graph serve a model on one device")
    dtype = next(model.parameters()).dtype
    if dtype not in (torch.float16, torch.bfloat16):
        return f"the model is {dtype}; llmk.attention_decode computes float16/bfloat16 models"
    rope_types = getattr(model.model.rotary_emb, "rope_type", "default")  # Gemma 3: one per layer type
    for rope_type in rope_types.values() if isinstance(rope_types, dict) else (rope_types,):
        if rope_type not in ROPE_TYPES:
            return (f"rope type {rope_type!r} changes its angles with the sequence length (supported: "
                    f"{', '.join(ROPE_TYPES)})")
    head_dim = model_head_dim(config)
    if head_dim not in _C.attention_decode_head_dims():
        return f"head_dim {head_dim} has no llmk.attention_decode kernel"
    if (any(v is not None for m in attention_modules(model) for v in score_variants(m).values())
            and not variants_run_on(next(iter(devices)), head_dim)):
        return (f"the model's sliding window, soft-capping or sinks run on llmk's Hopper forward only (the prefill), "
                f"which does not take head_dim {head_dim} on this GPU and build")
    return ""


def score_variants(module) -> dict:
    """llmk.attention's window / softcap / sinks of a decoder attention module, as the model's
    attention call passes them: its sliding window (Gemma 2/3, gpt-oss, Qwen2: the module's,
    None on full-attention layers; Mistral: the config's), Gemma 2's logit soft-capping,
    gpt-oss's sinks (in float32)."""
    if hasattr(module, "sliding_window"):
        window = module.sliding_window
    else:
        window = getattr(getattr(module, "config", None), "sliding_window", None)
    sinks = getattr(module, "sinks", None)
    return dict(window=window or None, softcap=getattr(module, "attn_logit_softcapping", None) or None,
                sinks=None if sinks is None else sinks.float())


def cache_options_error(model_dtype, dtype, page_size, dtype_name="dtype", page_size_name="page_size") -> str:
    """Why a KVCache's dtype or page size cannot be had ("" when they can), naming the
    arguments as the caller calls them."""
    if dtype not in (None, model_dtype, FP8):
        return f"{dtype_name} must be None (the model's), the model's dtype ({model_dtype}) or {FP8}, not {dtype}"
    if page_size is not None and (not isinstance(page_size, int) or page_size < 1):
        return f"{page_size_name} must be an int >= 1, not {page_size!r}"
    return ""


def model_key(model):
    """What a kept cache and its CUDA graph depend on: the model's dtype, device and the
    addresses of its first and last parameters (a .to(), .half() or reload changes them)."""
    params = list(model.parameters())
    return tuple((p.dtype, p.device, p.data_ptr()) for p in (params[0], params[-1]))


def attention_modules(model):
    return [m for m in model.modules() if all(hasattr(m, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
            and hasattr(m, "layer_idx")]


def _local_heads_kv(model, head_dim: int) -> int:
    """The kv heads this process computes: the config's, or under tensor parallelism (k_proj's
    weight a DTensor sharded by output rows) this rank's share; a quantized k_proj
    (llmk.quantization.QuantizedLinear) by its output features."""
    k_proj = attention_modules(model)[0].k_proj
    weight = getattr(k_proj, "weight", None)
    if weight is None:
        return k_proj.out_features // head_dim
    if hasattr(weight, "to_local"):
        weight = weight.to_local()
    return weight.shape[0] // head_dim


@dataclass
class _Prefill:
    """A prefill's per-sequence facts (from the attention mask), for the layers to read."""
    positions: torch.Tensor  # int32 [batch, tokens]: each token's position in its sequence (padding: 0); [tokens] unpadded
    lengths: torch.Tensor  # int32 [batch]: real tokens
    index: Optional[torch.Tensor]  # int64 [batch, tokens]: left-aligning gather (None: no padding)
    real: Optional[torch.Tensor]  # bool [batch, tokens] (None: no padding)
    cu_seqlens: Optional[torch.Tensor]  # int32 [batch + 1] over the real tokens (None: no padding)
    longest: int


class KVCache(Cache):
    """llmk's KV cache for ``generate`` on a model patched with ``llmk.patch(model, decode=True)``
    (the patch makes one per ``generate`` call and keeps it for later calls it fits; pass one as
    ``past_key_values`` to choose its size or kind yourself).

    Preallocated for ``batch_size`` sequences of up to ``max_length`` tokens (rounded up to a
    multiple of 256, then of ``page_size``), every layer in one tensor ``[layers, batch, slots, heads_kv, head_dim]``;
    ``dtype`` the model's (default) or ``torch.float8_e4m3fn`` (per layer and head float32 scales,
    set at each prefill from the prompt's largest key and value with 2x headroom; later values
    beyond it saturate at +-448); ``page_size`` lays the same memory out in pages of that many
    tokens, read through a block table (``llmk.attention_decode``'s paged path). A call past the
    capacity raises; nothing wraps. Inference only; beam search reorders it in place
    (``reorder_cache``), assisted generation crops it (``crop``). One you pass yourself is
    yours to ``reset()`` before a new prompt."""

    is_compileable = False

    def __init__(self, model: torch.nn.Module, batch_size: int, max_length: int, *, dtype: Optional[torch.dtype] = None,
                 page_size: Optional[int] = None):
        super().__init__(layers=[])
        reason = unsupported(model)
        if reason:
            raise ValueError(f"llmk.KVCache: {reason}")
        if batch_size < 1 or max_length < 1:
            raise ValueError(f"llmk.KVCache: batch_size ({batch_size}) and max_length ({max_length}) must be >= 1")
        param = next(model.parameters())
        self.model_dtype, self.device = param.dtype, param.device
        reason = cache_options_error(self.model_dtype, dtype, page_size)
        if reason:
            raise ValueError(f"llmk.KVCache: {reason}")
        self.dtype = self.model_dtype if dtype is None else dtype
        config = model.config
        self.num_layers = config.num_hidden_layers
        self.head_dim = model_head_dim(config)
        self.heads_kv = _local_heads_kv(model, self.head_dim)
        self._batch = batch_size
        self.requested_length = max_length
        self.page_size = page_size
        slots = -(-max_length // CAPACITY_ROUND) * CAPACITY_ROUND
        self.capacity = slots if page_size is None else -(-slots // page_size) * page_size
        shape = (self.num_layers, batch_size, self.capacity, self.heads_kv, self.head_dim)
        # Normal tensors even under torch.inference_mode: the cache outlives the call that made
        # it, and a later generate outside inference mode updates it in place.
        with torch.inference_mode(False):
            self.keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
            self.values = torch.zeros(shape, dtype=self.dtype, device=self.device)
            fp8 = self.dtype == FP8
            self.k_scale = torch.ones(self.num_layers, self.heads_kv, device=self.device) if fp8 else None
            self.v_scale = torch.ones(self.num_layers, self.heads_kv, device=self.device) if fp8 else None
            self.block_table = None
            if page_size is not None:  # page p of sequence b is page b * pages + p: the contiguous cache's bytes
                pages = self.capacity // page_size
                self.block_table = torch.arange(batch_size * pages, dtype=torch.int32,
                                                device=self.device).view(batch_size, pages)
            self.seqlens = torch.zeros(batch_size, dtype=torch.int32, device=self.device)
            self.rotary = _rotary_tables(model, self.capacity, self.model_dtype, self.device)
        self.model_key = model_key(model)
        self.length = 0  # tokens given per sequence so far, left padding included (what generate counts)
        self._prefill: Optional[_Prefill] = None
        self._graph = None
        self._graph_ready = False  # a one-token step ran eagerly (the warm-up a capture wants)

    def __repr__(self) -> str:
        gib = 2 * self.keys.numel() * self.keys.element_size() / 2**30
        paged = f", pages of {self.page_size}" if self.page_size else ""
        return (f"llmk.KVCache({self.num_layers} layers x {self._batch} sequences x {self.capacity} slots x "
                f"{self.heads_kv} heads x {self.head_dim}, {str(self.dtype).replace('torch.', '')}{paged}: "
                f"{gib:.2f} GiB; {self.length} tokens in)")

    # -- what transformers asks of a Cache --------------------------------------------------

    def __len__(self) -> int:
        return self.num_layers

    @property
    def batch_size(self) -> int:
        return self._batch

    @property
    def is_initialized(self) -> bool:
        return True

    @property
    def is_sliding(self):
        return [False] * self.num_layers

    @property
    def is_linear(self):
        return [False] * self.num_layers

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def get_max_length(self, layer_idx: Optional[int] = None) -> int:
        return self.capacity

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0):
        return self.length + query_length, 0

    def update(self, *args, **kwargs):
        raise RuntimeError("llmk.KVCache is written by llmk's attention (llmk.patch(model, decode=True)); this "
                           "model's attention called update(): it is not patched for it")

    def reset(self) -> None:
        self.length = 0
        self.seqlens.zero_()
        self._prefill = None

    def crop(self, tokens_to_remove: int) -> None:
        """Drops the last ``-tokens_to_remove`` tokens of every sequence (transformers' caches:
        a negative count; a positive value is the older form, the length to keep)."""
        tokens_to_remove = int(tokens_to_remove)  # assisted generation passes a 0-d tensor
        if tokens_to_remove > 0:
            remove = max(self.length - tokens_to_remove, 0)
        else:
            remove = min(-tokens_to_remove, self.length)
        self.length -= remove
        self.seqlens.sub_(remove).clamp_(min=0)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        beam_idx = beam_idx.to(self.device)
        for store in (self.keys, self.values):
            for layer in store:  # the filled slots, a layer at a time
                layer[:, : self.length].copy_(layer[:, : self.length].index_select(0, beam_idx))
        self.seqlens.copy_(self.seqlens.index_select(0, beam_idx))

    def batch_repeat_interleave(self, repeats: int):
        raise NotImplementedError("llmk.KVCache: batch_repeat_interleave (contrastive search) is not supported")

    def batch_select_indices(self, indices: torch.Tensor):
        raise NotImplementedError("llmk.KVCache: batch_select_indices (contrastive search) is not supported")

    # -- one forward -------------------------------------------------------------------------

    def forward(self, model, input_ids, inputs_embeds, attention_mask, logits_to_keep):
        """The logits of one forward of `model` (patched) over the new tokens, the cache
        updated: the prefill when the cache is empty, a decode step otherwise."""
        x = input_ids if input_ids is not None else inputs_embeds
        if x is None:
            raise ValueError("llmk.KVCache: the forward needs input_ids or inputs_embeds")
        batch, tokens = x.shape[:2]
        if batch != self._batch:
            raise ValueError(f"llmk.KVCache: a batch of {batch} sequences, but the cache holds {self._batch}")
        if self.length + tokens > self.capacity:
            raise ValueError(f"llmk.KVCache: {self.length} tokens cached + {tokens} new exceed its {self.capacity} "
                             f"slots (sized for max_length {self.requested_length}); generate with a larger "
                             "max_length, or make a larger llmk.KVCache")
        if self.length == 0:
            self._prefill = self._prefill_facts(attention_mask, batch, tokens, x.device)
            logits = self._run(model, input_ids, inputs_embeds, logits_to_keep, tokens)
        elif (self.device.type == "cuda" and tokens == 1 and input_ids is not None and isinstance(logits_to_keep, int)
              and not torch.cuda.is_current_stream_capturing() and not torch.compiler.is_compiling()):
            logits = self._graph_step(model, input_ids)
        else:
            logits = self._run(model, input_ids, inputs_embeds, logits_to_keep, tokens)
        self.length += tokens
        return logits

    def _run(self, model, input_ids, inputs_embeds, logits_to_keep, tokens):
        inner = model.model
        h = inner.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        for layer in inner.layers[: self.num_layers]:
            h = layer(h, attention_mask=None, position_ids=None, past_key_values=self, use_cache=True,
                      position_embeddings=None)
        h = inner.norm(h)
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = model.lm_head(h[:, keep])
        cap = getattr(model.config, "final_logit_softcapping", None)
        if cap is not None:  # Gemma 2's logits, as its causal LM computes them
            logits = torch.tanh(logits / cap) * cap
        if self._prefill is not None:
            self.seqlens.copy_(self._prefill.lengths)
            self._prefill = None
        else:
            self.seqlens.add_(tokens)
        return logits

    def _graph_step(self, model, input_ids):
        """A one-token decode step: eagerly on a side stream the first time, captured in a CUDA
        graph the second, replayed from then on (each returns its own logits)."""
        if self._graph is None:
            if not self._graph_ready:
                stream = torch.cuda.Stream(self.device)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    logits = self._run(model, input_ids, None, 1, 1)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                logits.record_stream(torch.cuda.current_stream(self.device))
                self._graph_ready = True
                return logits
            with torch.inference_mode(False):
                self._graph_ids = input_ids.clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._graph_logits = self._run(model, self._graph_ids, None, 1, 1)
            self._graph = graph
        self._graph_ids.copy_(input_ids)
        self._graph.replay()
        return self._graph_logits.clone()

    def _prefill_facts(self, attention_mask, batch, tokens, device) -> _Prefill:
        steps = torch.arange(tokens, dtype=torch.int32, device=device)
        if attention_mask is None or bool(attention_mask.all()):
            lengths = torch.full((batch,), tokens, dtype=torch.int32, device=device)
            return _Prefill(steps, lengths, None, None, None, tokens)
        if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, tokens):
            raise ValueError(f"llmk.KVCache: the prefill's attention mask must be [batch, tokens] = [{batch}, {tokens}], "
                             f"not {list(attention_mask.shape)}")
        real = attention_mask.to(device=device, dtype=torch.bool)
        if bool((real[:, 1:] < real[:, :-1]).any()):
            raise ValueError("llmk.KVCache: the prompts must be left-padded (the tokenizer's padding_side='left'), "
                             "with no padding between or after real tokens")
        lengths = real.sum(1, dtype=torch.int32)
        if bool((lengths == 0).any()):
            raise ValueError("llmk.KVCache: a prompt of the batch has no real token")
        pad = (tokens - lengths).view(batch, 1)
        positions = (steps.view(1, tokens) - pad).clamp(min=0).to(torch.int32)
        index = (steps.view(1, tokens) + pad).clamp(max=tokens - 1).long()
        cu = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        cu[1:] = lengths.cumsum(0)
        return _Prefill(positions, lengths, index, real, cu, int(lengths.max()))

    # -- the attention of one layer (called by the patched attention modules) ----------------

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
               window: Optional[int] = None, softcap: Optional[float] = None,
               sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Attention output ``[batch, tokens, heads_q, head_dim]`` of layer `layer` for q
        ``[batch, tokens, heads_q, head_dim]`` and the new tokens' k/v (not yet rotated), with the
        layer's score variants (:func:`score_variants`)."""
        variants = dict(window=window, softcap=softcap, sinks=sinks)
        rotary = self.rotary[layer]
        k_scale = self.k_scale[layer] if self.k_scale is not None else None
        v_scale = self.v_scale[layer] if self.v_scale is not None else None
        k_cache, v_cache = self.keys[layer], self.values[layer]
        if self._prefill is not None:
            return self._prefill_attend(layer, q, k, v, scale, k_cache, v_cache, rotary, variants)
        if self.block_table is not None:
            paged = (-1, self.page_size, self.heads_kv, self.head_dim)
            k_cache, v_cache = k_cache.view(paged), v_cache.view(paged)
        return ops.attention_decode(q, k_cache, v_cache, self.seqlens, self.block_table, k, v, rotary,
                                    causal=True, scale=scale, k_scale=k_scale, v_scale=v_scale, **variants)

    def _prefill_attend(self, layer, q, k, v, scale, k_cache, v_cache, rotary, variants):
        p = self._prefill
        tokens = q.shape[1]
        q, k = ops.rope(q, k, p.positions, rotary)
        if p.real is None:
            out = ops.attention(q, k, v, causal=True, scale=scale, **variants)
        else:
            packed = ops.attention_varlen(q[p.real], k[p.real], v[p.real], p.cu_seqlens, p.cu_seqlens, p.longest,
                                          p.longest, causal=True, scale=scale, **variants)
            out = q.new_zeros(q.shape)
            out[p.real] = packed
            gather = p.index.view(*p.index.shape, 1, 1).expand(-1, -1, *k.shape[2:])
            k, v = k.gather(1, gather), v.gather(1, gather)
        for new, cache, scales in ((k, k_cache, self.k_scale), (v, v_cache, self.v_scale)):
            if scales is None:
                cache[:, :tokens].copy_(new)
            else:  # per-head scales from this prompt, then x / scale rounded to e4m3 (saturating, as the kernel)
                amax = new.abs().amax(dim=(0, 1, 3)).float()
                scale_h = (amax * (FP8_HEADROOM / FP8_MAX)).clamp(min=1e-8)
                scales[layer].copy_(scale_h)
                cache[:, :tokens].copy_((new.float() / scale_h.view(1, 1, -1, 1)).clamp(-FP8_MAX, FP8_MAX).to(FP8))
        return out


def _rotary_tables(model, slots, dtype, device) -> list:
    """Per layer, float32 ``[slots, rot_dim]`` cos then sin of positions 0..slots-1 from the
    model's own rotary embedding (so every rope scaling it has is honoured; Gemma 3: the table
    of the layer's type, its local and global layers differ), rounded through the model's dtype
    as the model rounds them. Layers of one type share one table."""
    positions = torch.arange(slots, device=device).unsqueeze(0)
    x = torch.empty(0, dtype=dtype, device=device)
    rotary = model.model.rotary_emb
    layer_types = getattr(model.config, "layer_types", None) or ["full_attention"] * model.config.num_hidden_layers
    tables = {}
    for kind in dict.fromkeys(layer_types):
        cos, sin = rotary(x, positions, kind) if isinstance(getattr(rotary, "rope_type", None), dict) else \
            rotary(x, positions)
        cos, sin = cos[0], sin[0]
        half = cos.shape[-1] // 2
        if torch.equal(cos[:, :half], cos[:, half:]):  # NeoX halves repeated (gpt-oss's tables hold them once)
            cos, sin = cos[:, :half], sin[:, :half]
        tables[kind] = torch.cat([cos, sin], dim=-1).float().contiguous()
    return [tables[kind] for kind in layer_types[: model.config.num_hidden_layers]]


# -- the model changes of llmk.patch(model, decode=True) -------------------------------------


def attention_forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                      **kwargs):
    """A decoder attention module's forward: through the KVCache when given one, else the
    module's own."""
    if not isinstance(past_key_values, KVCache):
        return type(self).forward(self, hidden_states, position_embeddings=position_embeddings,
                                  attention_mask=attention_mask, past_key_values=past_key_values, **kwargs)
    batch, tokens = hidden_states.shape[:2]
    shape = (batch, tokens, -1, self.head_dim)
    qkv = self.__dict__.get("_llmk_qkv")  # patch(quantize=...)'s fused projection
    if qkv is not None:
        q, k, v = qkv(hidden_states).split([self.q_proj.out_features, self.k_proj.out_features,
                                            self.v_proj.out_features], -1)
        q, k, v = q.view(shape), k.view(shape), v.view(shape)
    else:
        q = self.q_proj(hidden_states).view(shape)
        k = self.k_proj(hidden_states).view(shape)
        v = self.v_proj(hidden_states).view(shape)
    if hasattr(self, "q_norm"):  # Qwen3: RMSNorm over each head
        q, k = self.q_norm(q), self.k_norm(k)
    out = past_key_values.attend(self.layer_idx, q, k, v, self.scaling, **score_variants(self))
    return self.o_proj(out.reshape(batch, tokens, -1)), None


def causal_lm_forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                      inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
    """The causal LM's forward: through the KVCache when given one, else the model's own."""
    if not isinstance(past_key_values, KVCache):
        return type(self).forward(self, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                  past_key_values=past_key_values, inputs_embeds=inputs_embeds, labels=labels,
                                  use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs)
    if labels is not None or kwargs.get("output_attentions") or kwargs.get("output_hidden_states"):
        raise ValueError("llmk.KVCache: a forward with labels, output_attentions or output_hidden_states is not "
                         "supported (the cache is for generation)")
    logits = past_key_values.forward(self, input_ids, inputs_embeds, attention_mask, logits_to_keep)
    return CausalLMOutputWithPast(logits=logits, past_key_values=past_key_values)


class Caches:
    """The KVCache that ``generate`` gets on a patched model (kept on the model, reused by the
    calls it fits, so that its CUDA graph is captured once). The next ``generate`` resets it: a
    cache returned in ``out.past_key_values`` is the model's and holds only until then, and two
    threads must not generate on one patched model at once. Made again when the model changes
    dtype or device."""

    def __init__(self, dtype: Optional[torch.dtype], page_size: Optional[int]):
        self.dtype, self.page_size = dtype, page_size
        self.cache: Optional[KVCache] = None

    def prepare(self, model, generation_config, model_kwargs, generation_mode, batch_size, max_cache_length):
        """transformers' ``_prepare_cache_for_generation``: a KVCache unless the caller chose a
        cache (``past_key_values`` or ``cache_implementation``) or no cache."""
        if (model_kwargs.get("past_key_values") is not None or generation_config.cache_implementation is not None
                or generation_config.use_cache is False or getattr(generation_config, "prefill_chunk_size", None)
                or generation_config.output_hidden_states or generation_config.output_attentions):
            # the caller's cache, or what llmk's forward does not give (chunked prefill, hidden
            # states, attention weights): transformers' own path
            return type(model)._prepare_cache_for_generation(model, generation_config, model_kwargs, generation_mode,
                                                             batch_size, max_cache_length)
        batch = max(generation_config.num_beams or 1, generation_config.num_return_sequences or 1) * batch_size
        cache = self.cache
        if cache is not None and cache.model_key != model_key(model):
            self.cache = cache = None  # the model moved or changed dtype: its graph points at the old weights
        if cache is None or cache.batch_size != batch or cache.capacity < max_cache_length:
            length = max_cache_length
            if cache is not None and cache.batch_size == batch:
                length = max(length, cache.capacity)
            self.cache = cache = None  # the old one's memory back first
            self.cache = cache = KVCache(model, batch, length, dtype=self.dtype, page_size=self.page_size)
        cache.reset()
        model_kwargs["past_key_values"] = cache
