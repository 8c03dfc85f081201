"""The tensor-parallel end-to-end suite, ``python -m llmk_bench --op e2e_tp --world 2`` (not in
--all: it needs `--world` GPUs): a Llama-3-8B-shaped model (hidden 4096, intermediate 14336, 32
heads, 8 kv heads of 128, vocab 128256, rope_theta 500000; random weights, bf16) with only its
first ``--e2e-tp-layers`` decoder layers (8 by default, as the generation suite, so that its
checkpoint saves and loads in seconds), loaded tensor-parallel by transformers over `--world`
processes, one GPU each (NCCL):

    python -m llmk_bench --op e2e_tp --world 2 --csv F --table F --plot F

- Checkpoint: rank 0 builds the model on its device (suites/e2e.py's ``build``: one seed,
  transformers' normal init of std 0.02, the norms moved off 1) and saves it with
  ``save_pretrained`` into the run's temporary directory (under /dev/shm where it has room);
  the other ranks wait for it, then every rank loads it with ``LlamaForCausalLM.from_pretrained(
  path, distributed_config=DistributedConfig(tp_plan="auto"), dtype=torch.bfloat16)`` (RANK,
  LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE set, the process group initialized); rank 0 then
  deletes the files. One model per rank serves every impl, patched and unpatched in turn (its
  weights checked unchanged at the end). The default size is 2.8 B parameters, 5.6 GB: built on
  the GPU that is seconds; on a CPU it is minutes (extrapolated from 1 and 2 layers on 2 cores:
  about 145 s to initialize, transformers' bf16 normal init drawing 20-30 M values/s, and 10 s
  to save), hence rank 0's GPU.
- Processes, rendezvous, NVLink multicast off, failure agreement between the ranks and rank 0's
  rows coming back through a file: as suites/distributed.py (its helpers).
- Impls: ``hf_tp``, the model as loaded (transformers' own TP forward: sharded projections, its
  all-reduces; DynamicCache, SDPA); ``llmk``, ``llmk.patch(model)`` (each decoder layer's two
  all-reduces fused with the residual add + RMSNorm after them; column ``tp_fused``: the
  report's count of "tensor-parallel all-reduce + residual add + rmsnorm (decoder layers)",
  the number of layers where the fusion ran); ``llmk_decode``, ``llmk.patch(model,
  decode=True)`` (llmk's KV cache holding the rank's kv heads, decode steps replayed from a CUDA
  graph), decode rows only.
- Decode (``phase`` decode; tokens = context, hidden = batch): as suites/generate.py, greedy,
  no EOS, NEW_TOKENS fixed, random prompt ids (no padding), contexts 1024 and 8192 x batch 1
  and 16. Per cell and impl: one warm-up ``generate`` of 1 + NEW_TOKENS tokens (its first
  scores give the error column), then ``generate`` of 1 token and of 1 + NEW_TOKENS, two calls
  each; the decode step is (t(1 + NEW) - t(1)) / NEW, ``ttft_us`` is t(1).
- Prefill (``phase`` prefill; tokens = prompt length, hidden = batch = 1): one forward of
  [1, 2048] and [1, 8192] ids without a cache, ``logits_to_keep=1``; warm-up calls, then the
  median of the timed calls. An impl's prefill cells run before its decode cells (as a server
  prefills before it decodes; after the decode cells, one run had both impls' 2048-token prefill
  1.4-6 ms slower, the host-bound part of it, not reproduced on the CPU). ``note`` counts the
  device allocations (cudaMalloc) the caching allocator made during the timed calls, if any.
- Timing: every call after dist.barrier() and a synchronize, so that the ranks start together,
  timed by perf_counter with the device synchronized after (what the caller waits for, the
  host's work included); a call's time is the slowest rank's; a cell's the smaller of the two
  (decode) or the median (prefill).

Columns: op ``e2e_tp``, the harness's (tokens, hidden, impl, time_us, max_rel_err) plus
``world``, ``phase``, ``batch``, ``layers``, ``tp_fused``, ``ttft_us`` (decode),
``tokens_per_s`` (decode: batch / step; prefill: tokens / time), ``agree`` (decode: generated
tokens equal to hf_tp's, of batch x NEW_TOKENS; random weights give near-ties), ``peak_mem_gb``
(the largest rank's, GPU), ``note``. max_rel_err: the logits of the prompt's last token against
hf_tp's on the same input (max|d| / max|ref|, the largest rank's).

Trimming: ``--e2e-tp-layers``, ``--e2e-tp-contexts``, ``--e2e-tp-batches``, ``--e2e-tp-prefill``,
``--e2e-tp-impls``. Time on 2 H200s: 93 s for the default set's 16 cells (measured at 4320757;
most of it hf_tp's and llmk's host-bound decode steps and the batch-16 x 8192 prompts' prefills
inside generate), plus the processes' start, imports and the checkpoint's build and load.

Without a GPU: the same code over gloo between `world` CPU processes (one torch thread each), the
tiny config (2 layers, hidden 256, 4 heads and 2 kv heads of 64, vocab 1024), contexts 32 and 64
x batch 1 and 2, 4 new tokens, prefill 64 and 256 tokens: the code path, not a measurement. The
table and plot: views/e2e_tp.py.
"""

import argparse
import datetime
import faulthandler
import gc
import json
import os
import shutil
import statistics
import time

import torch
import torch.distributed as dist

import llmk
from .. import timing
from ..views.common import sig
from ..views.e2e_tp import IMPLS, OP
from . import e2e, generate
from .distributed import RESULTS, TIMEOUT_S, _largest, _release, _together, spawn_ranks

GPU = dict(layers=8, contexts=(1024, 8192), batches=(1, 16), prefill=(2048, 8192), new_tokens=64,
           prefill_calls=(2, 5))
CPU = dict(layers=2, contexts=(32, 64), batches=(1, 2), prefill=(64, 256), new_tokens=4, prefill_calls=(1, 3))
TP_FUSED = "tensor-parallel all-reduce + residual add + rmsnorm (decoder layers)"
DECODE_CALLS = 2  # timed generate calls of each length; the smaller counts
READY = "checkpoint.json"  # rank 0's word that the checkpoint is saved (or why not)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(f"{OP} (see bench/llmk_bench/suites/e2e_tp.py; --world sets the processes)")
    g.add_argument("--e2e-tp-layers", type=int, metavar="N", help="decoder layers (default 8; 2 on the CPU)")
    g.add_argument("--e2e-tp-contexts", type=int, nargs="+", metavar="T",
                   help=f"decode prompt lengths (default {' '.join(map(str, GPU['contexts']))})")
    g.add_argument("--e2e-tp-batches", type=int, nargs="+", metavar="B",
                   help=f"decode batch sizes (default {' '.join(map(str, GPU['batches']))})")
    g.add_argument("--e2e-tp-prefill", type=int, nargs="+", metavar="T",
                   help=f"prefill lengths, batch 1 (default {' '.join(map(str, GPU['prefill']))})")
    g.add_argument("--e2e-tp-impls", nargs="+", choices=IMPLS, default=list(IMPLS), metavar="IMPL",
                   help=f"{' '.join(IMPLS)} (default: all; hf_tp always runs as the reference)")


def _setup(args, device):
    """The run's sizes and impls: the device's defaults, the arguments over them."""
    setup = dict(GPU if device == "cuda" else CPU)
    for key in ("layers", "contexts", "batches", "prefill"):
        setup[key] = getattr(args, f"e2e_tp_{key}", None) or setup[key]
    setup["impls"] = ["hf_tp"] + [i for i in IMPLS if i != "hf_tp" and i in (args.e2e_tp_impls or IMPLS)]
    return setup


def run(args, device, failures):
    """Every cell over `--world` processes (gloo on the CPU), one row per impl; failures collects
    what did not run. Rank 0's rows come back through a file."""
    world, setup = args.world, _setup(args, device)
    if world < 1:
        raise ValueError(f"{OP}: --world must be at least 1, got {world}")
    if device == "cuda" and torch.cuda.device_count() < world:
        print(f"{OP}: skipped: --world {world} needs {world} GPUs, this machine has {torch.cuda.device_count()}",
              flush=True)
        return []
    config = e2e.config_of("llama", setup["layers"], device)
    print(f"{OP} on {device}: world {world}, {e2e.FAMILIES['llama'][3]} shapes"
          f"{' (a tiny config on the CPU)' if device == 'cpu' else ''}, {setup['layers']} layers, bf16, "
          f"{_weight_bytes(config) / 1e9:.3g} GB of weights; decode contexts {list(setup['contexts'])} x batches "
          f"{list(setup['batches'])}, {setup['new_tokens']} new tokens; prefill {list(setup['prefill'])}; impls "
          f"{', '.join(setup['impls'])}", flush=True)
    return spawn_ranks(OP, _rank, (world, device, setup), world, failures, scratch=_scratch(_weight_bytes(config)))


def _weight_bytes(config):
    """Bytes of the model's bf16 weights (embeddings and lm_head untied)."""
    h, d = config.hidden_size, config.head_dim
    attn = h * d * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    layer = attn + 3 * h * config.intermediate_size + 2 * h
    return 2 * (2 * config.vocab_size * h + config.num_hidden_layers * layer + h)


def _scratch(size):
    """The temporary directory's parent: /dev/shm where it holds twice the checkpoint (no disk
    write), else the system's default."""
    try:
        return "/dev/shm" if shutil.disk_usage("/dev/shm").free > 2 * size else None
    except OSError:
        return None


# --------------------------------------------------------------------------------------
# one rank


def _rank(rank, world, device, setup, tmp):
    """A rank's run: the checkpoint (rank 0 saves it), the process group, the model loaded
    tensor-parallel, then every impl in turn (rank 0 prints and saves the rows)."""
    faulthandler.enable()  # a rank that crashes says where
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    if device == "cuda":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)  # the processes share the cores
    path = _checkpoint(rank, tmp, setup["layers"], device)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{tmp}/rendezvous",
                            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=TIMEOUT_S),
                            device_id=torch.device("cuda", rank) if device == "cuda" else None)
    rows, failures = [], []
    try:
        with torch.no_grad():
            model = _load(path, rank)
            weights, refs = _fingerprint(model), {}
            for impl in setup["impls"]:
                _run_impl(model, impl, setup, device, refs, rows, failures, tmp)
            if _fingerprint(model) != weights:
                failures.append(f"{OP}: the model's weights changed during the run")
            _save(rank, tmp, rows, failures)
    finally:
        _release(device)
        dist.destroy_process_group()


def _checkpoint(rank, tmp, layers, device):
    """The checkpoint's path: rank 0 builds and saves it, the other ranks wait for its word (a
    rank 0 that dies ends the run: the spawn terminates the others)."""
    path, ready = os.path.join(tmp, "model"), os.path.join(tmp, READY)
    if rank == 0:
        t0 = time.perf_counter()
        try:
            model = e2e.build("llama", layers, device)
            built = time.perf_counter() - t0
            model.save_pretrained(path)
            message = dict(ok=True, build_s=built, save_s=time.perf_counter() - t0 - built)
        except Exception as e:  # noqa: BLE001 - the other ranks are told, then every rank stops
            message = dict(ok=False, error=f"{type(e).__name__}: {e}")
        model = None
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        with open(ready + ".tmp", "w") as f:
            json.dump(message, f)
        os.replace(ready + ".tmp", ready)
        if message["ok"]:
            print(f"{OP}: checkpoint built on {device} in {message['build_s']:.1f} s, saved in "
                  f"{message['save_s']:.1f} s ({tmp})", flush=True)
    while not os.path.exists(ready):
        time.sleep(0.2)
    with open(ready) as f:
        message = json.load(f)
    if not message["ok"]:
        raise RuntimeError(f"{OP}: the checkpoint was not saved: {message['error']}")
    return path


def _load(path, rank):
    """The checkpoint loaded tensor-parallel on every rank (rank 0 then deletes the files: on
    /dev/shm they hold memory)."""
    import transformers

    t0 = time.perf_counter()
    model = transformers.LlamaForCausalLM.from_pretrained(
        path, distributed_config=transformers.DistributedConfig(tp_plan="auto"), dtype=torch.bfloat16).eval()
    if not hasattr(model.model.layers[0].self_attn.o_proj.weight, "to_local"):
        raise RuntimeError(f"{OP}: the model did not load sharded (tp_plan='auto')")
    dist.barrier()
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
        print(f"{OP}: loaded tensor-parallel in {time.perf_counter() - t0:.1f} s", flush=True)
    return model


def _fingerprint(model):
    """Per-parameter sums of the rank's shards (equal for equal weights)."""
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    return torch.stack([p.float().sum() for p in local]).tolist()


def _save(rank, tmp, rows, failures):
    if rank == 0:
        with open(os.path.join(tmp, RESULTS), "w") as f:
            json.dump(dict(rows=rows, failures=failures), f)


def _apply(model, impl):
    """The patch report of impl on model (None: hf_tp, the model as loaded)."""
    if impl == "llmk":
        return llmk.patch(model)
    if impl == "llmk_decode":
        return llmk.patch(model, decode=True)
    return None


def _run_impl(model, impl, setup, device, refs, rows, failures, tmp):
    """Every cell of one impl (rows on rank 0); a failure that every rank agrees on skips the
    cell (or, in the patch, the impl) and goes on."""
    rank = dist.get_rank()
    try:
        report = _together(lambda: _apply(model, impl), device)
    except Exception as e:  # noqa: BLE001 - every rank skips the impl
        failures.append(f"{OP} {impl}: patch failed: {type(e).__name__}: {str(e)[:300]}")
        if rank == 0:
            print(f"  {failures[-1]}", flush=True)
        return
    if report is not None and rank == 0:
        print(str(report), flush=True)
    fused = "" if report is None else report.replaced.get(TP_FUSED, 0)
    cells = [] if impl == "llmk_decode" else [("prefill", size, 1) for size in setup["prefill"]]
    cells += [("decode", ctx, batch) for ctx in setup["contexts"] for batch in setup["batches"]]
    try:
        for phase, tokens, batch in cells:
            row = _row(impl, phase, tokens, batch, setup["layers"], fused)
            try:
                result = _together(lambda: MEASURE[phase](model, tokens, batch, setup, device, impl, refs), device)
                row.update(result)
            except Exception as e:  # noqa: BLE001 - every rank skips the cell
                failures.append(f"{OP} {phase} {tokens} x {batch} {impl}: {type(e).__name__}: {str(e)[:300]}")
                row["note"] = f"failed: {failures[-1]}"
            _free(device)
            if rank == 0:
                rows.append(row)
                print(_line(row), flush=True)
            _save(rank, tmp, rows, failures)
    finally:
        if report is not None:
            llmk.unpatch(model)
        _free(device)


def _row(impl, phase, tokens, batch, layers, fused):
    return dict(op=OP, dtype="bfloat16", tokens=tokens, hidden=batch, impl=impl, time_us="", gbs="", pct_copy="",
                max_rel_err="", timing="perf_counter", world=dist.get_world_size(), phase=phase, batch=batch,
                layers=layers, tp_fused=fused, ttft_us="", tokens_per_s="", agree="", peak_mem_gb="", note="")


def _free(device):
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------
# timing (every rank; the results are the slowest rank's)


def _slowest_seconds(fn, device, calls):
    """The seconds of each of `calls` calls of fn, each started after a barrier and a
    synchronize on every rank, the slowest rank's."""
    times = []
    for _ in range(calls):
        dist.barrier()
        timing.sync(device)
        t0 = time.perf_counter()
        fn()
        timing.sync(device)
        times.append(time.perf_counter() - t0)
    return _largest(times, device)


def _reset_peak(device):
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak_gb(device):
    if device != "cuda":
        return ""
    return round(_largest([torch.cuda.max_memory_allocated()], device)[0] / 1e9, 2)


def _error(logits, ref, device):
    """max|logits - hf_tp's| / max|hf_tp's|, the largest rank's ("" without hf_tp's)."""
    if ref is None:
        return ""
    err = (logits - ref).abs().max().item() / (ref.abs().max().item() or 1.0)
    return f"{_largest([err], device)[0]:.2e}"


def decode(model, ctx, batch, setup, device, impl, refs):
    """The decode step of `generate` at (ctx, batch): a warm-up of 1 + NEW tokens, then 1 and
    1 + NEW tokens timed DECODE_CALLS times each; results as the row's columns. refs: hf_tp's
    (logits of the prompt's last token, generated tokens) per cell, hf_tp's run filling it."""
    new = setup["new_tokens"]
    ids = generate._ids(model.config.vocab_size, batch, ctx, next(model.parameters()).device)
    max_cache_len = ctx + 1 + new
    _reset_peak(device)
    out = generate._generate(model, ids, 1 + new, impl, max_cache_len, scores=True)
    first = min(_slowest_seconds(lambda: generate._generate(model, ids, 1, impl, max_cache_len), device,
                                 DECODE_CALLS))
    full = min(_slowest_seconds(lambda: generate._generate(model, ids, 1 + new, impl, max_cache_len), device,
                                DECODE_CALLS))
    step = (full - first) / new
    key, logits, tokens = ("decode", ctx, batch), out.scores[0].float(), out.sequences[:, ctx:]
    if impl == "hf_tp":
        refs[key] = (logits, tokens)
    ref_logits, ref_tokens = refs.get(key, (None, None))
    result = dict(time_us=round(step * 1e6, 1), ttft_us=round(first * 1e6, 1), tokens_per_s=sig(batch / step),
                  max_rel_err=_error(logits, ref_logits, device), peak_mem_gb=_peak_gb(device))
    if ref_tokens is not None:
        result["agree"] = f"{int((tokens == ref_tokens).sum())}/{tokens.numel()}"
    return result


def prefill(model, size, batch, setup, device, impl, refs):
    """One forward of [1, size] ids without a cache, logits of the last token: warm-up calls,
    then the median of the timed ones; results as the row's columns."""
    warmup, calls = setup["prefill_calls"]
    ids = generate._ids(model.config.vocab_size, batch, size, next(model.parameters()).device)

    def forward():
        return model(input_ids=ids, use_cache=False, logits_to_keep=1).logits

    _reset_peak(device)
    logits = forward()[:, -1].float()
    for _ in range(warmup):
        forward()
    mallocs = _device_allocs(device)
    seconds = statistics.median(_slowest_seconds(forward, device, calls))
    mallocs = _largest([_device_allocs(device) - mallocs], device)[0]
    key = ("prefill", size, batch)
    if impl == "hf_tp":
        refs[key] = (logits, None)
    return dict(time_us=round(seconds * 1e6, 1), tokens_per_s=sig(batch * size / seconds),
                max_rel_err=_error(logits, refs.get(key, (None,))[0], device), peak_mem_gb=_peak_gb(device),
                note=f"{int(mallocs)} cudaMalloc during the timed calls" if mallocs else "")


def _device_allocs(device):
    """The caching allocator's device allocations so far (0 on the CPU)."""
    return torch.cuda.memory_stats().get("num_device_alloc", 0) if device == "cuda" else 0


MEASURE = {"decode": decode, "prefill": prefill}


def _line(r):
    head = f"  {r['phase']:7s} {r['tokens']:6d} x {r['batch']:3d} {r['impl']:12s}"
    if r["note"].startswith("failed"):
        return f"{head} {r['note']}"
    what = (f"step {r['time_us'] / 1e3:8.3f} ms  ttft {r['ttft_us'] / 1e3:9.2f} ms  agree {r['agree'] or '-':>7}"
            if r["phase"] == "decode" else f"{r['time_us'] / 1e3:8.3f} ms")
    return (f"{head} {what}  {r['tokens_per_s']:>9} tok/s  err {r['max_rel_err'] or '-':>8}  "
            f"tp_fused {r['tp_fused'] if r['tp_fused'] != '' else '-'}"
            + (f"  peak {r['peak_mem_gb']} GB" if r["peak_mem_gb"] != "" else ""))
