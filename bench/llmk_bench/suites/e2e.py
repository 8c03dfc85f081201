"""The end-to-end suite, ``python -m llmk_bench --e2e``: whole Hugging Face models
(transformers 5.x) of each family, random weights from the architecture's config (nothing
downloaded, random token ids), bf16, the first few decoder layers only (``--e2e-layers``,
default 4). Each implementation gets a model built anew from one seed (the same weights:
checked; one model on the GPU at a time, so peak memory is that implementation's):

- ``eager``: the model as built, ``attn_implementation="sdpa"``; the reference of every error.
- ``compile``: ``torch.compile(model)`` (mode default). The family's mask builders
  (``create_causal_mask`` ...) are left to run eagerly (``torch.compiler.disable``): traced,
  transformers 5 materializes a [seq, seq] mask for every call, which keeps SDPA off its
  flash kernel (1 GiB of mask at 32768 tokens); eager, it returns no mask and SDPA runs
  causal as in the eager model. Prefill inputs are marked dynamic in their length, so one
  compilation serves both prefill sizes. Compile time is excluded from the timing and
  reported (``compile_s``: the first call minus the median).
- ``liger``: Liger-Kernel's ``apply_liger_kernel_to_<family>(model=...)`` with its defaults
  (RoPE, RMSNorm, SwiGLU/GeGLU, fused linear cross-entropy), where ``liger_kernel`` imports.
  Its module-level replacements are undone after its rows.
- ``llmk``: ``llmk.patch(model)`` (its report is printed once per family);
  ``llmk_linear``: ``llmk.patch(model, linear=True)``, every ``nn.Linear`` on ``llmk.linear``
  too (the projections and the LM head: llmk's GEMM against cuBLAS inside the same model);
  ``llmk_compile``: ``llmk.patch`` then ``torch.compile`` as above.

Phases (a CSV row per family, size and implementation; ``tokens`` is the sequence
length). Generation (decode steps through ``generate``) is its own suite: suites/generate.py.

- ``e2e_prefill``: one forward of batch 1 x 2048 and 1 x 32768 tokens without a cache,
  ``logits_to_keep=1`` (logits of the last token only) where the model takes it, else all
  (column ``logits``). Error: max|logits - ref| / max|ref| over the last token's logits.
- ``e2e_train``: one training step at 1 x 2048 in train mode: ``loss = model(ids,
  labels=ids).loss`` (the model's own cross-entropy over its logits: torch's for eager and
  llmk, Liger's fused linear cross-entropy for liger), ``loss.backward()``,
  ``torch.optim.AdamW(lr=1e-5).step()``, ``zero_grad(set_to_none=True)``, all in bf16.
  Error: |loss - ref| / |ref| of the first step (same weights for every implementation).

Timing: CUDA events around single calls, the GPU synchronized before each; the median of
5-10 calls after warm-up. Peak memory:
torch.cuda.max_memory_allocated over the timed calls after reset_peak_memory_stats (weights,
optimizer state included). tokens/s: tokens / time.

Time on the H100: the uncompiled implementations of every family run first (about 30 s a
family), then the compiled ones (compiling a 4-layer forward takes 30-90 s, a training
step's fwd+bwd longer), by default only for the families and phases of
``--e2e-compile-families`` (llama qwen3) and ``--e2e-compile-phases`` (prefill): the one
aim against compile is the prefill's. A compiled implementation that would start past
``--e2e-budget-s`` (450 s into the case) is skipped with a note, so that the default run
ends in about 8 minutes. The CSV is rewritten after every implementation, so a run cut off
keeps its rows.

Without a GPU: 2 layers of a tiny config of each family (hidden 256, 4 heads of 64, vocab
1024), 64 and 128 tokens, eager and llmk only (no torch.compile, Liger or CUDA graphs):
the code path, not a measurement. perf_counter around each call there.

The table and plot, and the speedups aimed at (AIMS), are in views/e2e.py.
"""

import argparse
import contextlib
import copy
import gc
import importlib
import inspect
import json
import sys
import time

import torch

import llmk
from .. import timing
from ..views.common import sig
from ..views.e2e import IMPLS, PHASES, is_e2e_row, markdown, plot  # noqa: F401

COMPILED = ("compile", "llmk_compile")
PATCH_OPTIONS = {"llmk_linear": dict(linear=True)}  # llmk.patch's arguments per llmk impl
SIZES = {"cuda": {"prefill": (2048, 32768), "train": (2048,)}, "cpu": {"prefill": (64, 128), "train": (64,)}}
LAYERS = {"cuda": 4, "cpu": 2}
# (warm-up calls after the first, timed calls) per phase and size class; the first call
# (compilation, autotuning, allocation) is never timed.
CALLS = {"cuda": {"prefill": {2048: (2, 10), 32768: (1, 5)}, "train": (2, 5)},
         "cpu": {"prefill": (1, 3), "train": (1, 3)}}
LR = 1e-5
# Seconds a compiled implementation is assumed to need per phase (compilation included):
# the budget check before starting one.
COMPILE_ESTIMATE_S = {"prefill": 90, "train": 150}
DEFAULT_BUDGET_S = 450

# The shapes of one real checkpoint per family (its first --e2e-layers layers).
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", "apply_liger_kernel_to_llama", "Llama-3-8B", dict(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        vocab_size=128256, rms_norm_eps=1e-5, max_position_embeddings=131072,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=8192))),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "apply_liger_kernel_to_qwen2", "Qwen2.5-7B", dict(
        hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4, head_dim=128,
        vocab_size=152064, rms_norm_eps=1e-6, rope_parameters=dict(rope_type="default", rope_theta=1e6))),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "apply_liger_kernel_to_qwen3", "Qwen3-8B", dict(
        hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        vocab_size=151936, rms_norm_eps=1e-6, rope_parameters=dict(rope_type="default", rope_theta=1e6))),
    "mistral": ("MistralConfig", "MistralForCausalLM", "apply_liger_kernel_to_mistral", "Mistral-7B-v0.3", dict(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        vocab_size=32768, rms_norm_eps=1e-5, sliding_window=None,
        rope_parameters=dict(rope_type="default", rope_theta=1e6))),
    # 4 layers of Gemma 3 keep its two kinds of layers: sliding-window (1024) ones and a
    # global one last (the checkpoint has 5 sliding for each global).
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", "apply_liger_kernel_to_gemma3_text", "Gemma-3-4B", dict(
        hidden_size=2560, intermediate_size=10240, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
        vocab_size=262208, rms_norm_eps=1e-6, query_pre_attn_scalar=256, sliding_window=1024,
        rope_parameters={"full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1e6),
                         "sliding_attention": dict(rope_type="default", rope_theta=1e4)})),
    # Gemma 2 soft-caps its attention logits, which SDPA does not (transformers runs SDPA
    # without it): not a default family.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", "apply_liger_kernel_to_gemma2", "Gemma-2-9B", dict(
        hidden_size=3584, intermediate_size=14336, num_attention_heads=16, num_key_value_heads=8, head_dim=256,
        vocab_size=256000, rms_norm_eps=1e-6, query_pre_attn_scalar=256, sliding_window=4096,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    # gpt-oss: sinks on every layer, a window of 128 on alternating ones, a mixture of 32 experts
    # (4 a token) that runs as transformers' (llmk.patch leaves it); SDPA does not compute its
    # sinks: transformers runs its eager attention. Not a default family (no Liger-Kernel patch).
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", None, "gpt-oss-20b", dict(
        hidden_size=2880, intermediate_size=2880, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
        vocab_size=201088, rms_norm_eps=1e-5, sliding_window=128, num_local_experts=32, num_experts_per_tok=4,
        rope_parameters=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, rope_theta=150000.0,
                             original_max_position_embeddings=4096))),
}
DEFAULT_FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma3")
DEFAULT_COMPILE_FAMILIES = ("llama", "qwen3")
DEFAULT_COMPILE_PHASES = ("prefill",)
# The CPU version: a tiny config of each family (sliding windows shorter than the sequence).
TINY = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            vocab_size=1024)
TINY_GEMMA = dict(query_pre_attn_scalar=64, sliding_window=32)
TINY_GPT_OSS = dict(sliding_window=32, num_local_experts=4, num_experts_per_tok=2)
# transformers' attention per family: SDPA, but where the model has no SDPA path (gpt-oss's sinks)
ATTENTION = {"gpt_oss": "eager"}
GPU_ONLY = {"compile": "torch.compile (Inductor's CPU backend compiles C++: minutes)",
            "liger": "Liger-Kernel (Triton kernels: GPU only)", "llmk_compile": "torch.compile"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("end-to-end models (see bench/llmk_bench/suites/e2e.py)")
    g.add_argument("--e2e", action="store_true",
                   help="whole models: prefill and a training step per family (in --all on a GPU)")
    g.add_argument("--e2e-families", nargs="+", choices=list(FAMILIES), default=list(DEFAULT_FAMILIES),
                   metavar="FAMILY", help=f"families (default: {' '.join(DEFAULT_FAMILIES)}; also gemma2)")
    g.add_argument("--e2e-layers", type=int, metavar="N", help="decoder layers per model (default: 4; 2 on the CPU)")
    g.add_argument("--e2e-phases", nargs="+", choices=PHASES, default=list(PHASES), metavar="PHASE",
                   help="prefill train (default: both)")
    g.add_argument("--e2e-impls", nargs="+", choices=IMPLS, default=list(IMPLS), metavar="IMPL",
                   help=f"{' '.join(IMPLS)} (default: all; eager always runs as the reference)")
    g.add_argument("--e2e-compile-families", nargs="+", choices=list(FAMILIES),
                   default=list(DEFAULT_COMPILE_FAMILIES), metavar="FAMILY",
                   help=f"families that the compiled impls run for (default: {' '.join(DEFAULT_COMPILE_FAMILIES)})")
    g.add_argument("--e2e-compile-phases", nargs="+", choices=PHASES, default=list(DEFAULT_COMPILE_PHASES),
                   metavar="PHASE", help=f"phases that the compiled impls run for (default: "
                                         f"{' '.join(DEFAULT_COMPILE_PHASES)})")
    g.add_argument("--e2e-budget-s", type=float, default=DEFAULT_BUDGET_S, metavar="S",
                   help="a compiled impl that would end past S seconds into the case (by an estimate of its "
                        "compile time) is skipped, its rows saying so (default %(default)s)")


# --------------------------------------------------------------------------------------
# models and implementations


def config_of(family, layers, device):
    """The family's transformers config: `layers` decoder layers, SDPA attention (gpt-oss: eager;
    a tiny one on the CPU)."""
    import transformers

    config_name, _, _, _, shapes = FAMILIES[family]
    kwargs = dict(copy.deepcopy(shapes), num_hidden_layers=layers)  # configs change nested dicts
    if device == "cpu":
        kwargs.update(TINY, **(TINY_GEMMA if family.startswith("gemma") else TINY_GPT_OSS if family == "gpt_oss"
                               else {}))
    if family == "gemma3":
        kwargs["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 or i == layers - 1 else "sliding_attention"
                                 for i in range(layers)]
    return getattr(transformers, config_name)(**kwargs, attn_implementation=ATTENTION.get(family, "sdpa"))


def build(family, layers, device, dtype=torch.bfloat16):
    """The family's causal LM in eval mode with random weights, the same at every call (one seed)."""
    import transformers

    config = config_of(family, layers, device)
    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(transformers, FAMILIES[family][1])._from_config(config, dtype=dtype)
    model.to(device).eval()
    with torch.no_grad():  # norm weights start at 1 (Gemma: 0, of 1 + w): make them differ from it
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def fingerprint(model) -> list:
    """Per-parameter sums: equal for equal weights (a deterministic reduction)."""
    with torch.no_grad():
        return torch.stack([p.float().sum() for p in model.parameters()]).tolist()


def _mask_builders(modeling):
    return [n for n in vars(modeling) if n.startswith("create_") and n.endswith("mask") and callable(vars(modeling)[n])]


@contextlib.contextmanager
def implementation(name, model, family, reports):
    """(model, forward) of impl `name` on `model` (freshly built); module-level changes undone
    on exit. reports collects llmk.patch's report per family (printed the first time)."""
    modeling = sys.modules[type(model).__module__]
    restore = {}  # module globals to put back
    patched = False
    try:
        if name.startswith("llmk"):
            report = llmk.patch(model, **PATCH_OPTIONS.get(name, {}))
            patched = True
            if family not in reports:
                print(str(report), flush=True)
            reports[family] = report
        if name == "liger":
            liger = importlib.import_module("liger_kernel.transformers")
            before = dict(vars(modeling))
            getattr(liger, FAMILIES[family][2])(model=model)
            restore.update({k: v for k, v in before.items() if vars(modeling).get(k) is not v})
        forward = model
        if name in COMPILED:
            for n in _mask_builders(modeling):
                restore.setdefault(n, vars(modeling)[n])
                setattr(modeling, n, torch.compiler.disable(vars(modeling)[n]))
            forward = torch.compile(model)
        yield model, forward
    finally:
        vars(modeling).update(restore)
        if patched:
            try:
                llmk.unpatch(model)
            except Exception as e:  # noqa: BLE001 - the model is dropped anyway: say so, go on
                print(f"  llmk.unpatch failed: {type(e).__name__}: {_short(e)}", flush=True)
        if name in COMPILED:
            torch._dynamo.reset()


def _unavailable(name, device, family=None):
    """Why impl `name` cannot run here ("" when it can)."""
    if device == "cpu" and name in GPU_ONLY:
        return f"no GPU: {GPU_ONLY[name]}"
    if name == "liger" and family is not None and FAMILIES[family][2] is None:
        return f"Liger-Kernel has no patch for {family}"
    if name.startswith("llmk") and not hasattr(llmk, "patch"):
        return "llmk.patch does not exist in this build"
    if name == "liger":
        try:
            importlib.import_module("liger_kernel.transformers")
        except Exception as e:  # noqa: BLE001 - any import failure: skip with its reason
            return f"import liger_kernel.transformers failed: {type(e).__name__}: {e}"
    return ""


# --------------------------------------------------------------------------------------
# timing


def _timed(fn, device, warmup, reps):
    """(first call's output, its seconds, median seconds of `reps` calls after `warmup`
    more, peak bytes allocated over the last warm-up and the timed calls): CUDA events
    around each call after a synchronize, perf_counter on the CPU."""
    timing.sync(device)
    t0 = time.perf_counter()
    first = fn()
    timing.sync(device)
    first_s = time.perf_counter() - t0
    for _ in range(warmup - 1):  # median_seconds makes the last warm-up call
        fn()
    _reset_peak(device)
    median = timing.median_seconds(fn, device, reps)
    return first, first_s, median, _peak(device)


def _reset_peak(device):
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak(device):
    return torch.cuda.max_memory_allocated() if device == "cuda" else 0


def _calls(device, phase, size):
    calls = CALLS[device][phase]
    return calls[size] if isinstance(calls, dict) else calls


def _ids(vocab, length, device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, length), generator=g).to(device)


def _keeps_last(model) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def prefill(model, forward, size, device, compiled):
    ids = _ids(model.config.vocab_size, size, device, seed=size)
    if compiled:  # one compilation for every prefill length
        torch._dynamo.maybe_mark_dynamic(ids, 1)
    kwargs = dict(input_ids=ids, use_cache=False)
    keep = _keeps_last(model)
    if keep:
        kwargs["logits_to_keep"] = 1
    with torch.no_grad():
        out, first_s, median, peak = _timed(lambda: forward(**kwargs).logits, device, *_calls(device, "prefill", size))
    return dict(out=out[:, -1].float(), first_s=first_s, time_s=median, peak=peak, method=_method(device),
                extra=dict(logits="last" if keep else "all"))


def train(model, forward, size, device, compiled):
    ids = _ids(model.config.vocab_size, size, device, seed=size + 1)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)

    def step():
        loss = forward(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    loss, first_s, median, peak = _timed(step, device, *_calls(device, "train", size))
    model.eval()
    return dict(out=loss.float(), first_s=first_s, time_s=median, peak=peak, method=_method(device))


MEASURE = {"prefill": prefill, "train": train}


def _method(device):
    return "events" if device == "cuda" else "cpu"


def _short(e, limit=300):
    return " ".join(str(e).split())[:limit]


def _error(out, ref):
    if ref is None:
        return ""
    if out.dim() == 0:  # a loss
        return f"{abs(out.item() - ref.item()) / (abs(ref.item()) or 1.0):.2e}"
    scale = ref.abs().max().item() or 1.0
    return f"{(out - ref).abs().max().item() / scale:.2e}"


# --------------------------------------------------------------------------------------
# the run


class _Run:
    """State of one --e2e run: rows, references, reports, failures, the clock."""

    def __init__(self, args, device, failures, checkpoint):
        self.args, self.device, self.failures, self.checkpoint = args, device, failures, checkpoint
        self.layers = args.e2e_layers or LAYERS[device]
        self.rows, self.refs, self.reports, self.weights = [], {}, {}, {}
        self.start = time.perf_counter()

    def elapsed(self):
        return time.perf_counter() - self.start

    def row(self, family, model_config, phase, size, impl, note="", result=None):
        r = dict(op=f"e2e_{phase}", dtype="bfloat16", tokens=size, hidden=model_config.hidden_size, impl=impl,
                 time_us="", gbs="", pct_copy="", max_rel_err="", timing="", model=family, tokens_per_s="",
                 peak_mem_gb="", layers=self.layers, note=note)
        if result is not None:
            t = result["time_s"]
            r.update(time_us=round(t * 1e6, 1), max_rel_err=result["err"], timing=result["method"],
                     tokens_per_s=sig(size / t), **result.get("extra", {}))
            if self.device == "cuda":
                r["peak_mem_gb"] = round(result["peak"] / 1e9, 2)
            if impl in COMPILED:
                r["compile_s"] = round(max(result["first_s"] - t, 0.0), 1)
        if impl.startswith("llmk") and family in self.reports:
            r["llmk_left"] = json.dumps(getattr(self.reports[family], "left", {}))
        self.rows.append(r)
        return r

    def run_impl(self, family, impl, phases, emit=True):
        """Every (phase, size) of one impl of one family, on a model built for it (the same
        weights each time: checked); one row each (unless not emit)."""
        t0 = time.perf_counter()
        config = config_of(family, self.layers, self.device)
        try:
            model = build(family, self.layers, self.device)
            if family not in self.weights:
                print(f"{family}: {FAMILIES[family][3]} shapes, {self.layers} layers, "
                      f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters", flush=True)
            weights = fingerprint(model)
            note = "" if self.weights.setdefault(family, weights) == weights else "weights differ from the eager model's"
            ctx = implementation(impl, model, family, self.reports)
            model, forward = ctx.__enter__()
        except Exception as e:  # noqa: BLE001 - the impl does not build: every row says so
            self._fail(family, config, impl, phases, f"{type(e).__name__}: {_short(e)}")
            failed = True
        else:
            failed = False
        if failed:  # out of the except clause, whose traceback holds the model
            model = None
            self._free()
            return
        try:
            for phase in phases:
                for size in SIZES[self.device][phase]:
                    self._measure(family, config, model, forward, impl, phase, size, emit, note)
        finally:
            ctx.__exit__(None, None, None)
            del model, forward, ctx
            self._free()
        print(f"  {family} {impl}: {time.perf_counter() - t0:.0f} s (run so far {self.elapsed():.0f} s)", flush=True)
        self.checkpoint(self.rows)

    def _measure(self, family, config, model, forward, impl, phase, size, emit, note=""):
        try:
            result = MEASURE[phase](model, forward, size, self.device, impl in COMPILED)
        except Exception as e:  # noqa: BLE001 - report, go on with the next case
            reason = f"{type(e).__name__}: {_short(e)}"
            result = None
        if result is None:  # out of the except clause, whose traceback holds the case's tensors (an OOM)
            self._free()
            self.failures.append(f"e2e {family} {phase} {size} {impl}: {reason}")
            print(f"  {family:8s} {phase:7s} {size:6d} {impl:12s} failed: {reason}", flush=True)
            if emit:
                self.row(family, config, phase, size, impl, note=f"failed: {reason}")
            return
        key = (family, phase, size)
        if impl == "eager":
            self.refs[key] = result["out"]
        result["err"] = _error(result["out"], self.refs.get(key))
        del result["out"]
        if emit:
            note = "; ".join(n for n in (note, result.get("note", "")) if n)
            r = self.row(family, config, phase, size, impl, note=note, result=result)
            extra = f"  compile {r['compile_s']:.0f} s" if "compile_s" in r else ""
            peak = f"  peak {r['peak_mem_gb']} GB" if r["peak_mem_gb"] != "" else ""
            print(f"  {family:8s} {phase:7s} {size:6d} {impl:12s} {r['time_us'] / 1e3:9.2f} ms  "
                  f"{r['tokens_per_s']:>9} tok/s{peak}  err {r['max_rel_err']}{extra}"
                  + (f"  ({r['note']})" if r["note"] else ""), flush=True)

    def _fail(self, family, config, impl, phases, reason):
        self.failures.append(f"e2e {family} {impl}: {reason}")
        print(f"  {family} {impl} failed: {reason}", flush=True)
        for phase in phases:
            for size in SIZES[self.device][phase]:
                self.row(family, config, phase, size, impl, note=f"failed: {reason}")

    def skip(self, family, impl, phases, reason):
        config = config_of(family, self.layers, self.device)
        for phase in phases:
            for size in SIZES[self.device][phase]:
                self.row(family, config, phase, size, impl, note=f"skipped: {reason}")

    def _free(self):
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()


def run(args, device, failures, checkpoint=lambda rows: None):
    """Every row of the end-to-end case on `device`; failures collects what did not run;
    checkpoint(rows) is called after every implementation (to write the CSV so far)."""
    try:
        import transformers
    except ImportError as e:
        failures.append(f"e2e: transformers does not import: {e}")
        print(f"e2e skipped: {failures[-1]}", flush=True)
        return []
    if device == "cuda":
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 1024)
    state = _Run(args, device, failures, checkpoint)
    phases = [p for p in PHASES if p in args.e2e_phases]
    impls = [i for i in IMPLS if i in args.e2e_impls]
    unavailable = {i: _unavailable(i, device) for i in impls}
    for impl, why in unavailable.items():
        if why:
            print(f"e2e: skipping {impl}: {why}", flush=True)
    runnable = [i for i in impls if not unavailable[i]]
    eager_pass = [i for i in runnable if i not in COMPILED]
    compiled = [i for i in runnable if i in COMPILED]
    print(f"e2e on {device}: {', '.join(args.e2e_families)}; {state.layers} layers, bf16; transformers "
          f"{transformers.__version__}, torch {torch.__version__}; impls {', '.join(runnable)}"
          + (f" (compiled for {', '.join(args.e2e_compile_families)}: {', '.join(args.e2e_compile_phases)})"
             if compiled else ""), flush=True)
    # The uncompiled impls of every family first, then the compiled ones (minutes each), so
    # that a run cut short has the first kind for every family.
    for family in args.e2e_families:
        t0 = time.perf_counter()
        for impl in ["eager"] + [i for i in eager_pass if i != "eager"]:
            why = _unavailable(impl, device, family)
            if why:
                print(f"  {family} {impl} skipped: {why}", flush=True)
                state.skip(family, impl, phases, why)
                continue
            state.run_impl(family, impl, phases, emit=impl in eager_pass)
        for impl in impls:
            if unavailable[impl] and device == "cuda":
                state.skip(family, impl, phases, unavailable[impl])
        print(f"{family}: {time.perf_counter() - t0:.0f} s (run so far {state.elapsed():.0f} s)", flush=True)
    cphases = [p for p in phases if p in args.e2e_compile_phases]
    for family in [f for f in args.e2e_families if f in args.e2e_compile_families] if compiled and cphases else []:
        t0 = time.perf_counter()
        for impl in compiled:
            estimate = sum(COMPILE_ESTIMATE_S[p] for p in cphases)
            if state.elapsed() + estimate > args.e2e_budget_s:
                why = (f"time budget: {state.elapsed():.0f} s spent, about {estimate} s more needed, "
                       f"--e2e-budget-s {args.e2e_budget_s:.0f}")
                print(f"  {family} {impl} skipped: {why}", flush=True)
                state.skip(family, impl, cphases, why)
                continue
            state.run_impl(family, impl, cphases)
        print(f"{family} compiled: {time.perf_counter() - t0:.0f} s (run so far {state.elapsed():.0f} s)",
              flush=True)
    return state.rows
