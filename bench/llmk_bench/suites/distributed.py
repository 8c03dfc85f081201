"""Benchmark cases of the distributed family (`--op all_reduce_add_rmsnorm`; not in --all, as it
needs several GPUs): a tensor-parallel layer's all-reduce + residual add + RMSNorm,
``llmk.distributed.all_reduce_add_rmsnorm``, over `--world` processes, one GPU each:

    python -m llmk_bench --op all_reduce_add_rmsnorm --world 2 --csv F --table F --plot F
    python -m llmk_bench --op all_reduce_add_rmsnorm --world 4 --csv F --table F --plot F

- Processes: the runner spawns `world` processes (torch.multiprocessing, spawn), rank r on
  cuda:r, ``init_process_group("nccl", init_method="file://...")`` on a file of a temporary
  directory. NVLink multicast stays off: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
  NVSHMEM_DISABLE_NVLS=1 are set before the spawn, whatever the environment said. With fewer
  GPUs than `world` the suite says so and writes no rows.
- Cases: x and residual [tokens, hidden] bf16 on every rank, weight [hidden] bf16, eps 1e-5, at
  tokens = 1, 2, 4, ..., 2048 and hidden = 4096, 8192 (a decode step's rows up to a prefill
  chunk's; Llama-3-8B's and -70B's widths): messages of 8 KiB to 32 MiB.
- Impls: ``llmk`` (llmk.distributed.all_reduce_add_rmsnorm on its default path,
  LLMK_ALL_REDUCE_PATH=auto; the row's ``path`` is what auto picks for the case,
  ``llmk.distributed.all_reduce_path``); ``llmk_fused`` (LLMK_ALL_REDUCE_PATH=fused, set around
  each call, so inside the CUDA graph's capture, where the path is chosen), only where auto does
  not pick the fused path already and only where the message fits the fused kernel (where the op
  raises, the row is left out and the run says why); ``llmk_one_shot`` and ``llmk_two_shot``:
  the fused path with its kernel forced (LLMK_ALL_REDUCE_KERNEL), where the message fits;
  ``nccl_unfused``, the baseline:
  ``dist.all_reduce(x)`` then ``torch.ops.llmk.add_rmsnorm_(x, residual, weight, eps, 0.0)``.
- Timing: every rank runs the same sequence, so that the collectives match; every step that may
  fail is agreed on by all ranks (an all-reduce of a flag) before the next collective. Per case
  and impl: input sets rotated as the harness does (timing.buffer_sets: at least 256 MiB of x
  and residual per cycle; the same values on every rank, as a tensor-parallel layer's residual
  is), warm-up calls (3, and one per set at least) on a side stream, then a CUDA graph of 100 calls captured on every
  rank and replayed 8 times (the first untimed), each replay after dist.barrier() and a
  synchronize so that the ranks start together, timed by CUDA events. A call's time is the
  replay's over 100 (so the ranks' start skew after the barrier weighs a hundredth of itself
  on a call); a rank's the median of the 7 replays; the row's the largest rank's
  (timing ``graph``). When any rank fails to capture, every rank times the 100 calls launched
  one by one the same way (timing ``events``, the error in ``note``).
- Correctness: on one fresh input per case and impl. Every rank draws every rank's x (seeded)
  and so computes the reference locally: the ranks' x summed in float64 and rounded to bf16
  (the all-reduce's output), added to the residual and rounded (the residual's new value), and
  that sum's RMSNorm in float64; ``max_rel_err`` is max|x out - ref| / max|ref|, the largest
  rank's.

Columns: the harness's (tokens and hidden per rank, time_us, max_rel_err, timing), plus
``world`` and ``path`` (the all-reduce the row took: ``fused`` or ``nccl``; ``gloo`` on the
CPU). ``gbs`` is the all-reduce's bus bandwidth at the row's time (nccl-tests' busbw: 2 (world -
1) / world x the message's bytes, tokens x hidden x 2, over the time); ``pct_copy`` is empty
(no NVLink ceiling is measured). The tables' ``vs nccl_unfused`` is the baseline's time over
the impl's (above 1: faster than the unfused sequence).

Trimming: ``--ar-tokens``, ``--ar-hidden`` or the environment variables LLMK_BENCH_AR_TOKENS /
_HIDDEN (comma-separated); ``--tokens`` / ``--hidden`` of the harness take precedence. A full
run is 24 cases of up to 3 rows each.
Without a GPU: the same protocol over gloo between `world` CPU processes (one torch thread
each) at tokens 1, 64 x hidden 512, impls ``llmk`` (gloo's all-reduce then add_rmsnorm_ inside
the op; path ``gloo``) and ``gloo_unfused``, timed by perf_counter around the 100 calls (timing
``cpu``)."""

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import llmk
from .. import timing
from ..views.common import sig
from ..views.distributed import BASELINES, OP
from .gemm import _env_list

TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
HIDDEN = [4096, 8192]
CPU = dict(tokens=[1, 64], hidden=[512])
DTYPE, EPS = torch.bfloat16, 1e-5
PATH_VAR = "LLMK_ALL_REDUCE_PATH"
KERNEL_VAR = "LLMK_ALL_REDUCE_KERNEL"  # the fused path's kernel: one_shot or two_shot (include/llmk/all_reduce.h)
KERNELS = ("one_shot", "two_shot")
FORCED = ("llmk_fused", *(f"llmk_{k}" for k in KERNELS))
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
WARM_UP, CALLS, REPLAYS = 3, 100, 7
TIMEOUT_S = 120  # a collective that waits this long has lost its peers: the process group aborts
RESULTS = "rows.json"  # rank 0's rows and failures, rewritten after every case


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(f"{OP} (see bench/llmk_bench/suites/distributed.py)")
    g.add_argument("--world", type=int, default=2, help="processes, one GPU each (default 2)")
    g.add_argument("--ar-tokens", type=int, nargs="+", metavar="TOKENS",
                   help=f"rows per rank (default {' '.join(map(str, TOKENS))}; env LLMK_BENCH_AR_TOKENS)")
    g.add_argument("--ar-hidden", type=int, nargs="+", metavar="HIDDEN",
                   help=f"hidden sizes (default {' '.join(map(str, HIDDEN))}; env LLMK_BENCH_AR_HIDDEN)")


def _selection(args, device):
    """(world, [(tokens, hidden)]) of the run."""
    if args.world < 1:
        raise ValueError(f"{OP}: --world must be at least 1, got {args.world}")
    cpu = device == "cpu"

    def pick(name, default):
        env = [int(v) for v in _env_list(f"LLMK_BENCH_AR_{name.upper()}") or []]
        return getattr(args, name, None) or getattr(args, f"ar_{name}", None) or env or default

    return args.world, [(t, h) for h in pick("hidden", CPU["hidden"] if cpu else HIDDEN)
                        for t in pick("tokens", CPU["tokens"] if cpu else TOKENS)]


def run(args, device, failures):
    """Every case over `--world` processes (gloo on the CPU), one row per impl; failures collects
    what did not run. Rank 0's rows come back through a file."""
    world, cases = _selection(args, device)
    if device == "cuda" and torch.cuda.device_count() < world:
        print(f"{OP}: skipped: --world {world} needs {world} GPUs, this machine has {torch.cuda.device_count()}",
              flush=True)
        return []
    print(f"{OP} on {device}: world {world}, {len(cases)} cases, up to {len(cases) * (3 if device == 'cuda' else 2)} "
          "rows", flush=True)
    if os.environ.get(PATH_VAR):
        print(f"{OP}: {PATH_VAR}={os.environ[PATH_VAR]} is set: impl llmk takes that path", flush=True)
    return spawn_ranks(OP, _rank, (world, device, cases), world, failures)


def spawn_ranks(op, rank_fn, args, world, failures, scratch=None):
    """Runs ``rank_fn(rank, *args, tmp)`` in `world` spawned processes (NVLink multicast off),
    ``tmp`` a temporary directory (under `scratch` if given) where rank 0 leaves its rows and
    failures (RESULTS); returns the rows, `failures` extended. A rank that dies keeps what rank 0
    measured before."""
    os.environ.update(NO_MULTICAST)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        try:
            mp.start_processes(rank_fn, args=(*args, tmp), nprocs=world, join=True, start_method="spawn")
        except Exception as e:  # noqa: BLE001 - a rank died: keep what rank 0 measured before
            failures.append(f"{op} world={world}: {type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}")
            print(f"{op}: {failures[-1]}", flush=True)
        rows, rank_failures = _results(tmp)
    failures += rank_failures
    print(f"{op}: {len(rows)} rows in {time.perf_counter() - t0:.0f} s", flush=True)
    return rows


def _results(tmp):
    try:
        with open(os.path.join(tmp, RESULTS)) as f:
            saved = json.load(f)
    except FileNotFoundError:
        return [], []
    return saved["rows"], saved["failures"]


# --------------------------------------------------------------------------------------
# one rank


def _rank(rank, world, device, cases, tmp):
    """A rank's run: every case in order (rank 0 prints and saves the rows)."""
    if device == "cuda":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)  # the processes share the cores
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{tmp}/rendezvous",
                            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=TIMEOUT_S),
                            device_id=torch.device("cuda", rank) if device == "cuda" else None)
    rows, failures = [], []
    try:
        for tokens, hidden in cases:
            rows += _case(tokens, hidden, device, failures)
            if rank == 0:
                with open(os.path.join(tmp, RESULTS), "w") as f:
                    json.dump(dict(rows=rows, failures=failures), f)
    finally:
        _release(device)
        dist.destroy_process_group()


def _release(device):
    """Frees the fused path's peer buffers (llmk.distributed.release_peer_groups), once every rank
    is done with them, before the process group goes."""
    if device == "cuda":
        dist.barrier()
        llmk.distributed.release_peer_groups()


def _together(step, device):
    """step()'s result when it returned on every rank; raises on every rank when it raised on any
    (the ranks would otherwise go on to different collectives)."""
    try:
        out, error = step(), None
    except Exception as e:  # noqa: BLE001 - the ranks agree first
        out, error = None, e
    ok = torch.tensor([0.0 if error else 1.0], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if ok.item() < 1:
        raise error or RuntimeError("failed on another rank")
    return out


def _largest(values, device):
    """Each of `values`, its largest over the ranks."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _case(tokens, hidden, device, failures):
    """Rows of one case (on rank 0; [] on the others); llmk's failure drops the case."""
    world, rank = dist.get_world_size(), dist.get_rank()
    label, line = f"{OP} world={world} {tokens} x {hidden}", f"{OP} w={world} {tokens:5d} x {hidden:5d}"

    def report(message):
        if rank == 0:
            print(f"{line}  {message}", flush=True)

    try:
        fresh, reference, sets, auto = _together(lambda: _prepare(tokens, hidden, device), device)
    except Exception as e:  # noqa: BLE001 - out of memory, say: report, go on
        failures.append(f"{label}: {type(e).__name__}: {str(e)[:300]}")
        report(f"skipped: {failures[-1]}")
        return []
    backend = dist.get_backend()
    rows, times = [], {}
    for impl, fn in _impls(auto, device).items():
        try:
            us, err, method, note = _measure(fn, sets, fresh, reference, device)
        except Exception as e:  # noqa: BLE001 - report, go on with the next impl
            message = f"{type(e).__name__}: {str(e)[:300]}"
            if impl in FORCED:  # the message does not fit the fused kernel: no row
                report(f"{impl} left out: {message}")
                continue
            failures.append(f"{label} {impl}: {message}")
            report(f"{impl} failed: {failures[-1]}")
            if impl == "llmk":
                return []
            continue
        times[impl] = us
        path = auto if impl == "llmk" else "fused" if impl in FORCED else backend
        rows.append(_row(tokens, hidden, world, impl, path, us, err, method, note))
    del sets
    if device == "cuda":
        torch.cuda.empty_cache()
    if "llmk" not in times:
        return []
    report(f"path {auto:5s}  " + "  ".join(f"{i} {t:8.2f}us" for i, t in times.items()))
    return rows if rank == 0 else []


def _row(tokens, hidden, world, impl, path, us, err, method, note):
    bus = tokens * hidden * DTYPE.itemsize * 2 * (world - 1) / world
    row = dict(op=OP, dtype=str(DTYPE).replace("torch.", ""), tokens=tokens, hidden=hidden, impl=impl,
               time_us=round(us, 3), gbs=sig(bus / us / 1e3), pct_copy="", max_rel_err=f"{err:.2e}", timing=method,
               world=world, path=path)
    if note:
        row["note"] = note
    return row


# --------------------------------------------------------------------------------------
# inputs, impls, reference


def _prepare(tokens, hidden, device):
    """(this rank's fresh (x, residual, weight), the float64 reference of the op's x output, the
    timing's input sets, the path auto picks): the same draws on every rank."""
    world, rank = dist.get_world_size(), dist.get_rank()
    g = torch.Generator(device=device).manual_seed(tokens * 100003 + hidden)

    def draw(*shape):
        return torch.randn(*shape, generator=g, device=device).to(DTYPE)

    xs = [draw(tokens, hidden) for _ in range(world)]
    residual, weight = draw(tokens, hidden), (1 + 0.1 * torch.randn(hidden, generator=g, device=device)).to(DTYPE)
    reference = _reference(xs, residual, weight)
    sets = timing.buffer_sets(lambda: (draw(tokens, hidden), draw(tokens, hidden), weight),
                              4 * tokens * hidden * DTYPE.itemsize, device)
    return (xs[rank], residual, weight), reference, sets, _auto_path(xs[rank])


def _reference(xs, residual, weight):
    """The ranks' sum rounded to bf16 (the all-reduce's output), added to the residual and rounded
    (its new value), and the float64 RMSNorm of that."""
    total = sum(x.double() for x in xs).to(DTYPE)
    s = (residual.double() + total.double()).to(DTYPE).double()
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * weight.double()


def _auto_path(x):
    """The all-reduce path llmk's default takes for x: llmk.distributed.all_reduce_path on a GPU
    (which may set the group's peer buffers up: a collective step); the process group's backend,
    gloo, on the CPU."""
    return llmk.distributed.all_reduce_path(x) if x.is_cuda else dist.get_backend()


def _llmk(x, residual, weight):
    return llmk.distributed.all_reduce_add_rmsnorm(x, residual, weight, EPS)[0]


def _unfused(x, residual, weight):
    dist.all_reduce(x)
    torch.ops.llmk.add_rmsnorm_(x, residual, weight, EPS, 0.0)
    return x


def _impls(auto, device):
    """{impl: fn(x, residual, weight) -> x} of a case, llmk first."""
    impls = {"llmk": _llmk}
    if device == "cuda" and auto != "fused":
        impls["llmk_fused"] = timing.with_env(PATH_VAR, "fused", _llmk)
    if device == "cuda":  # the fused path's two kernels, each forced (where the message fits)
        for kernel in KERNELS:
            impls[f"llmk_{kernel}"] = timing.with_env(PATH_VAR, "fused", timing.with_env(KERNEL_VAR, kernel, _llmk))
    impls[BASELINES[0] if device == "cuda" else BASELINES[1]] = _unfused
    return impls


# --------------------------------------------------------------------------------------
# timing


def _measure(fn, sets, fresh, reference, device):
    """(us, max_rel_err, timing method, note) of fn, each the largest rank's."""
    _together(lambda: _warm_up(fn, sets, device), device)
    err = _together(lambda: _rel_err(fn(*[t.clone() for t in fresh]), reference), device)
    run, method, note = _runner(fn, sets, device)
    us, err = _largest([_median_us(run, device), err], device)
    return us, err, method, note


def _warm_up(fn, sets, device):
    """WARM_UP calls at least, a call per set, on a side stream on a GPU (as before a capture)."""
    calls = _calls(fn, sets, max(WARM_UP, len(sets)))
    if device != "cuda":
        return calls()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        calls()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()


def _rel_err(out, reference):
    return (out.double() - reference).abs().max().item() / (reference.abs().max().item() or 1.0)


def _calls(fn, sets, count=CALLS):
    def run():
        for i in range(count):
            fn(*sets[i % len(sets)])
    return run


def _graph(run):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay


def _runner(fn, sets, device):
    """(run, timing method, note): run() makes CALLS calls, a CUDA graph's replay when every rank
    captured it, else the calls launched one by one."""
    calls = _calls(fn, sets)
    if device != "cuda":
        return calls, "cpu", ""
    try:
        return _together(lambda: _graph(calls), device), "graph", ""
    except Exception as e:  # noqa: BLE001 - not capturable on some rank: time plain launches
        torch.cuda.synchronize()
        return calls, "events", f"not captured ({type(e).__name__}: {str(e)[:200]}): the calls launched one by one"


def _median_us(run, device):
    """Median microseconds per call over REPLAYS runs of run() (after an untimed one), each
    started together on every rank."""
    times = []
    for _ in range(REPLAYS + 1):
        dist.barrier()
        timing.sync(device)
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / CALLS)
        else:
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e6 / CALLS)
    return statistics.median(times[1:])
