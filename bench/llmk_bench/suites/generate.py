"""The generation suite, ``python -m llmk_bench --op e2e_decode``: Hugging Face ``generate`` on a
Llama-3-8B-shaped model (``--gen-family``: another family's checkpoint shapes from the e2e
suite, e.g. gemma2 for soft-capping and sliding windows, gpt_oss for sinks; random weights,
bf16, the first ``--gen-layers`` decoder layers: 8 by
default, so that every peer's compilation and the batch-16 x 32768 cache fit one device run),
prompts of random token ids (no padding), greedy, no EOS, ``max_new_tokens`` fixed:

- ``hf_eager``: ``model.generate`` as it comes: DynamicCache, SDPA.
- ``hf_static_compile``: transformers' documented fastest path: ``cache_implementation="static"``
  (a StaticCache sized for the cell's longest call, ``max_cache_len``) with generate's automatic
  ``torch.compile(mode="reduce-overhead")`` of the decode steps (CUDA graphs). Its compilations
  happen in the warm-up call, untimed (``compile_s``: the warm-up minus a timed call).
- ``llmk``: ``llmk.patch(model, decode=True)`` (llmk.KVCache, llmk.attention prefill,
  llmk.attention_decode steps replayed from a CUDA graph, llmk's norms, RoPE and MLP gate;
  cuBLAS projections); ``llmk_fp8``: the same with ``kv_cache_dtype=torch.float8_e4m3fn``;
  ``llmk_int4``: the same with ``quantize="int4-g128"`` (the decoder's projections on
  llmk.quantized_linear, round-to-nearest int4 weights in groups of 128; the lm_head stays
  bf16), on a copy of the model (its max_rel_err and agreement include the quantization's
  change of the model).

One model is built per cell set (the weights checked equal for every impl) and patched /
unpatched in turn. Per (context, batch) cell and impl: one warm-up ``generate`` of
``1 + NEW_TOKENS`` tokens (its scores give the error column), then, timed with the GPU
synchronized around each call (perf_counter: what the caller waits for, the host's work
included), ``generate`` of 1 token (time to first token: the prefill and one sampling step)
and of ``1 + NEW_TOKENS``, the smaller of two calls each (one where the warm-up took over 10 s). The decode step's time is
(t(1 + NEW_TOKENS) - t(1)) / NEW_TOKENS: the time per generated token after the first.

CSV op ``e2e_decode``: tokens = context, hidden = batch (and a ``batch`` column), ``model``,
``layers``, time_us = the decode step, ``ttft_us``, tokens_per_s = batch / step, max_rel_err = the
first step's logits (the prompt's last) against hf_eager's, ``agree`` = generated tokens equal to
hf_eager's (of batch x NEW_TOKENS; random weights give near-ties, so a few part), peak memory;
llmk rows also ``graph_us``: one replay of the captured step alone (the GPU's part of time_us).
Where hf_static_compile's prefill runs out of memory (its [batch, 1, ctx, slots] mask at batch
16 x 32768), the cell is measured again with its chunked prefill (``prefill_chunk_size``
8192) and the note says so.

Without a GPU: 2 layers of a tiny config, contexts 64 and 128, batch 1 and 2, 8 new tokens,
hf_eager and llmk only: the code path, not a measurement. The table and plot: views/generate.py.
"""

import copy
import gc
import time

import torch

import llmk
from .. import timing
from . import e2e
from ..views.generate import IMPLS, OP

GPU = dict(contexts=(4096, 32768), batches=(1, 16), layers=8, new_tokens=64)
CPU = dict(contexts=(64, 128), batches=(1, 2), layers=2, new_tokens=8)
CHUNK = 8192  # hf_static_compile's prefill chunk where the whole prompt's does not fit
REPLAYS = 20  # graph replays timed for graph_us
SLOW_S = 10.0  # a warm-up generate longer than this: the timed calls run once, not twice
GPU_ONLY = {"hf_static_compile": "torch.compile (Inductor's CPU backend compiles C++: minutes)",
            "llmk_fp8": "llmk's fp8 cache on the CPU is the reference backend"}


def add_arguments(parser) -> None:
    g = parser.add_argument_group("generation (--op e2e_decode, see bench/llmk_bench/suites/generate.py)")
    g.add_argument("--gen-family", choices=list(e2e.FAMILIES), default="llama", metavar="FAMILY",
                   help=f"the model's family, its checkpoint's shapes ({' '.join(e2e.FAMILIES)}; default llama)")
    g.add_argument("--gen-layers", type=int, metavar="N", help="decoder layers (default 8 on a GPU, 2 on the CPU)")
    g.add_argument("--gen-contexts", type=int, nargs="+", metavar="T", help="prompt lengths (default 4096 32768)")
    g.add_argument("--gen-batches", type=int, nargs="+", metavar="B", help="batch sizes (default 1 16)")
    g.add_argument("--gen-impls", nargs="+", choices=IMPLS, default=list(IMPLS), metavar="IMPL",
                   help=f"{' '.join(IMPLS)} (default: all; hf_eager always runs as the reference)")


def _generate(model, ids, new, impl, max_cache_len, scores=False, chunk=None):
    kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=None,
                  attention_mask=torch.ones_like(ids))
    if impl == "hf_static_compile":
        from transformers import CompileConfig

        kwargs.update(cache_implementation="static", max_cache_len=max_cache_len,
                      compile_config=CompileConfig(mode="reduce-overhead"))
        if chunk:
            kwargs["prefill_chunk_size"] = chunk
    if scores:
        kwargs.update(output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        return model.generate(ids, **kwargs)


def _seconds(fn, device, calls=2):
    best = float("inf")
    for _ in range(calls):
        timing.sync(device)
        t0 = time.perf_counter()
        fn()
        timing.sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def _ids(vocab, batch, length, device):
    g = torch.Generator().manual_seed(length * 31 + batch)
    return torch.randint(1, vocab, (batch, length), generator=g).to(device)


def _apply(model, impl):
    if impl == "llmk":
        return llmk.patch(model, decode=True)
    if impl == "llmk_fp8":
        return llmk.patch(model, decode=True, kv_cache_dtype=torch.float8_e4m3fn)
    if impl == "llmk_int4":
        return llmk.patch(model, decode=True, quantize="int4-g128")
    return None


def run(args, device, failures, checkpoint=lambda rows: None):
    """The rows of every (context, batch, impl) on `device`; failures collects what did not run."""
    setup = dict(GPU if device == "cuda" else CPU)
    setup["layers"] = args.gen_layers or setup["layers"]
    contexts = args.gen_contexts or setup["contexts"]
    batches = args.gen_batches or setup["batches"]
    new = setup["new_tokens"]
    impls = ["hf_eager"] + [i for i in IMPLS if i in args.gen_impls and i != "hf_eager"]
    rows = []
    family = getattr(args, "gen_family", None) or "llama"
    model = e2e.build(family, setup["layers"], device)
    weights = e2e.fingerprint(model)
    config = model.config
    print(f"e2e_decode on {device}: {e2e.FAMILIES[family][3]} shapes, {setup['layers']} layers, bf16; contexts "
          f"{contexts}, batches {batches}, {new} new tokens; impls {', '.join(impls)}", flush=True)
    refs = {}
    for impl in impls:
        if device == "cpu" and impl in GPU_ONLY:
            print(f"  {impl}: skipped on the CPU: {GPU_ONLY[impl]}", flush=True)
            continue
        report = None
        # quantize replaces the model's weights: it runs on a copy
        target = copy.deepcopy(model) if impl == "llmk_int4" else model
        try:
            report = _apply(target, impl)
            if report is not None and impl in ("llmk", "llmk_int4"):
                print(str(report), flush=True)
            for ctx in contexts:
                for batch in batches:
                    rows.append(_cell(target, impl, ctx, batch, new, device, setup["layers"], refs, failures, family))
                    print(_line(rows[-1]), flush=True)
                    checkpoint(rows)
        finally:
            if report is not None:
                llmk.unpatch(target)
            del target
            if impl == "hf_static_compile":
                torch._dynamo.reset()
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
    if e2e.fingerprint(model) != weights:
        failures.append("e2e_decode: the model's weights changed during the run")
    return rows


def _cell(model, impl, ctx, batch, new, device, layers, refs, failures, family="llama"):
    row = dict(op=OP, dtype="bfloat16", tokens=ctx, hidden=batch, batch=batch, impl=impl, model=family, layers=layers,
               time_us="", ttft_us="", tokens_per_s="", max_rel_err="", agree="", peak_mem_gb="", compile_s="", graph_us="", note="",
               gbs="", pct_copy="", timing="perf_counter")
    ids = _ids(model.config.vocab_size, batch, ctx, device)
    max_cache_len = ctx + 1 + new
    out, reason, chunk = None, "", None
    for attempt in range(2):
        try:
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            out = _generate(model, ids, 1 + new, impl, max_cache_len, scores=True, chunk=chunk)
            timing.sync(device)
            warm_s = time.perf_counter() - t0
            calls = 1 if warm_s > SLOW_S else 2  # a cell whose generate takes many seconds: one timed call each
            first = _seconds(lambda: _generate(model, ids, 1, impl, max_cache_len, chunk=chunk), device, calls)
            full = _seconds(lambda: _generate(model, ids, 1 + new, impl, max_cache_len, chunk=chunk), device, calls)
            break
        except Exception as e:  # noqa: BLE001 - report, go on with the next cell
            reason = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
            out = None
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        # transformers' static path builds a [batch, 1, ctx, max_cache_len] mask for the prefill:
        # where that does not fit, its own chunked prefill (the decode steps are unchanged)
        if impl != "hf_static_compile" or "OutOfMemoryError" not in reason or attempt:
            break
        chunk = CHUNK
        row["note"] = f"prefill in chunks of {CHUNK} (prefill_chunk_size): the whole prompt's ran out of memory"
    if out is None:
        failures.append(f"e2e_decode {ctx} x {batch} {impl}: {reason}")
        row["note"] = "; ".join(n for n in (row["note"], f"failed: {reason}") if n)
        return row
    step = (full - first) / new
    tokens = out.sequences[:, ctx:]
    logits = out.scores[0].float()
    key = (ctx, batch)
    if impl == "hf_eager":
        refs[key] = (tokens, logits)
    ref_tokens, ref_logits = refs.get(key, (None, None))
    if ref_logits is not None:
        row["max_rel_err"] = f"{(logits - ref_logits).abs().max().item() / ref_logits.abs().max().item():.2e}"
        row["agree"] = f"{int((tokens == ref_tokens).sum())}/{tokens.numel()}"
    row.update(time_us=round(step * 1e6, 1), ttft_us=round(first * 1e6, 1), tokens_per_s=round(batch / step, 1))
    if device == "cuda":
        row["peak_mem_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
    if impl == "hf_static_compile":
        row["compile_s"] = round(max(warm_s - full, 0.0), 1)
    if impl.startswith("llmk") and device == "cuda":
        row["graph_us"] = _graph_step_us(model)
    del out
    return row


def _graph_step_us(model):
    """The GPU time of one decode step alone: the median of REPLAYS replays of the patched
    model's captured step (CUDA events), the cache's lengths put back after. Beside the step
    time of generate it says what generate's own per-token work (host time with the GPU idle
    after each step's synchronization) costs."""
    cache = model._llmk_patch["decode"].cache
    graph = getattr(cache, "_graph", None)
    if graph is None:
        return ""
    lengths = cache.seqlens.clone()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
        cache.seqlens.copy_(lengths)
    return round(sorted(times)[len(times) // 2], 1)


def _line(r):
    if r["note"].startswith("failed"):
        return f"  {r['tokens']:6d} x {r['batch']:3d} {r['impl']:18s} {r['note']}"
    return (f"  {r['tokens']:6d} x {r['batch']:3d} {r['impl']:18s} step {r['time_us'] / 1e3:8.3f} ms  "
            f"{r['tokens_per_s']:>9} tok/s  ttft {r['ttft_us'] / 1e3:9.2f} ms  err {r['max_rel_err'] or '-':>8}  "
            f"agree {r['agree'] or '-':>8}  peak {r['peak_mem_gb'] or '-'} GB"
            + (f"  compile {r['compile_s']} s" if r["compile_s"] != "" else "")
            + (f"  graph step {r['graph_us'] / 1e3:.3f} ms" if r.get("graph_us") else "")
            + (f"  ({r['note']})" if r["note"] else ""))
