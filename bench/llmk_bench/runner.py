"""The benchmark runner: one CLI over the per-family suites (suites/<family>.py: cases and run;
views/<family>.py: table and plot, without torch).

python -m llmk_bench --op rmsnorm [--op ...] [--all] [--dtype float16] [--csv F] [--plot F] [--table F]
python -m llmk_bench --op gemm [--gemm-shapes ...] [--gemm-m ...] [--gemm-parts ...]
python -m llmk_bench --op quantized_linear [--qlinear-shapes ...] [--qlinear-m ...] [--qlinear-formats ...]
python -m llmk_bench --op all_reduce_add_rmsnorm --world 2 [--ar-tokens ...] [--ar-hidden ...]
python -m llmk_bench --op e2e_tp --world 2 [--e2e-tp-layers N] [--e2e-tp-contexts ...] [--e2e-tp-prefill ...]
python -m llmk_bench --e2e [--e2e-families ...] [--e2e-layers N] [--e2e-phases ...] [--e2e-impls ...]
python -m llmk_bench --from-csv A.csv [B.csv ...] [--table F] [--plot F]
python -m llmk_bench --op rmsnorm --tokens 8192 --hidden 4096 --impls [IMPL ...] --variant base --csv F
python -m llmk_bench --ab-summary A.csv [B.csv ...]
(PYTHONPATH: python/ for llmk, bench/ for llmk_bench; `make bench` sets both.)

On a GPU: every case of the op's sweep, llmk beside its peers, in one run; a CSV of all
timings, a markdown table and a plot. Without a GPU: the same cases on the CPU backend at
small shapes (each suite's CPU_SWEEPS), beside the same peers where they run on the CPU
(torch.compile and the GPU-only SDPA backends are skipped, with a note), written the same
way; the table's header and the plot's title say that it is the CPU backend. The run ends by
saying where the CSV, the table and the plot went.
`--op overhead` (also in --all) is what an eager PyTorch user pays per call: see
suites/overhead.py. `--op gemm` (also in --all) is the GEMM family, llmk.linear against cuBLAS
over real models' weight shapes, the fused epilogues and rmsnorm_linear, with its own
trimming flags: see suites/gemm.py. `--op quantized_linear` (also in --all) is the weight-only
int4 / int8 llmk.quantized_linear against cuBLAS on the bf16 weight, tinygemm and int8pack over
real models' weight shapes, with its own sweep and trimming flags: see suites/quantized.py.
`--op all_reduce_add_rmsnorm` (not in --all: it needs `--world` GPUs) is
llmk.distributed.all_reduce_add_rmsnorm against NCCL's all-reduce then add_rmsnorm_, over
`--world` processes (gloo between CPU processes without a GPU): see suites/distributed.py.
`--op e2e_tp` (not in --all: it needs `--world` GPUs) is a tensor-parallel Llama-3-8B-shaped
model over `--world` processes, transformers' TP forward against llmk.patch: see suites/e2e_tp.py.
`--e2e` (in --all on a GPU) times whole Hugging Face models, eager against torch.compile,
Liger-Kernel and llmk.patch: see suites/e2e.py.
Liger-Kernel is a peer wherever it has the op and imports (liger_peers.py). `--impls` keeps
llmk and the named peers (none: llmk alone), `--variant` labels the rows, and `--ab-summary`
compares the labelled runs of an A/B (tools/gpu_ab.sh builds the base and the new tree and
alternates them). A case that fails (an op not built, a peer that does not run) is reported
and skipped; the run then exits with status 1 after writing what it measured.
"""

import argparse
import csv
import datetime
import importlib
import os
import platform
import subprocess
import sys

from . import views
from .views.common import CPU_NOTE, columns, fmt, header_line, on_cpu, parse_header, plot_title, sig

# The suites, in the order their sweeps run and their tables print: suites/<name>.py.
SUITES = ("norm", "activation", "softmax", "rope", "optim", "loss", "attention", "attention_variants", "decode",
          "attention_cache", "chain", "gemm", "quantized", "distributed", "overhead", "e2e", "generate", "e2e_tp")
OVERHEAD = "overhead"
GENERATE = "e2e_decode"  # generate on a whole model: suites/generate.py's run
GEMM = "gemm"  # its own sweep over (M, N, K) and fused forms: suites/gemm.py's run
QLINEAR = "quantized_linear"  # its own sweep over (format, M, N, K): suites/quantized.py's run
ALL_REDUCE = "all_reduce_add_rmsnorm"  # its own processes, one GPU each: suites/distributed.py's run
E2E_TP = "e2e_tp"  # a tensor-parallel model over its own processes: suites/e2e_tp.py's run
# Peers that the CPU run leaves out, and why.
GPU_ONLY_PEERS = {"compile": "torch.compile (Inductor's CPU backend compiles C++ per shape: minutes for a sweep)"}


def suites():
    """{name: module} of every suite (imports torch and llmk)."""
    return {name: importlib.import_module(f"{__package__}.suites.{name}") for name in SUITES}


def sweep_tables(modules):
    """(OPS, SWEEPS, POINTS) over the suites with per-op sweeps: op -> case; device -> op -> (tokens,
    hidden) lists (--tokens / --hidden override them); op -> the (tokens, hidden) points of a
    sweep that is not a cross product (decode: batch x context)."""
    with_sweeps = [m for m in modules.values() if isinstance(getattr(m, "OPS", None), dict)]
    ops = {op: case for m in with_sweeps for op, case in m.OPS.items()}
    sweeps = {"cuda": {op: s for m in with_sweeps for op, s in m.SWEEPS.items()},
              "cpu": {op: s for m in with_sweeps for op, s in m.CPU_SWEEPS.items()}}
    points = {op: set(p) for m in with_sweeps for op, p in getattr(m, "POINTS", {}).items()}
    return ops, sweeps, points


def _load():
    """Imports torch, llmk and the suites (a run needs them; --from-csv and --ab-summary do not)."""
    global torch, llmk, timing, MODULES, OPS, SWEEPS, POINTS
    import torch
    import llmk
    from . import timing
    MODULES = suites()
    OPS, SWEEPS, POINTS = sweep_tables(MODULES)


def _commit() -> str:
    if os.environ.get("LLMK_COMMIT"):
        return os.environ["LLMK_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=os.path.dirname(__file__)).stdout.strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _max_error(fn, reference, sample):
    """Max error relative to max|reference|. A reference may cover part of the output: it then
    returns (ref, select), select picking that part out of the op's output."""
    fresh = [t.clone() for t in sample]
    ref = reference(*[t.clone() for t in sample])
    got = _first(fn(*fresh))
    if isinstance(ref, tuple):
        ref, select = ref
        got = select(got)
    got = got.double()
    scale = ref.abs().max().item() or 1.0
    return (got - ref).abs().max().item() / scale


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    threads = torch.get_num_threads()
    return f"{model}, torch on {threads} thread{'s' if threads > 1 else ''} ({CPU_NOTE})"


def machine(device, ops) -> dict:
    """The device's name and the ceilings the rows are measured against (only what `ops` need)."""
    info = dict(device=torch.cuda.get_device_name() if device == "cuda" else _cpu_name())
    if any(op in OPS or op in (GEMM, QLINEAR) for op in ops):
        info.update(copy_gbs=timing.copy_bandwidth_gbs(device), empty_us=timing.empty_launch_us(device))
    # The tensor-core ceiling, measured only when a compute-bound op (one that counts FLOPs) runs.
    if any(op in MODULES["attention"].OPS or op in MODULES["attention_variants"].OPS
           or op in MODULES["attention_cache"].OPS or op in (GEMM, QLINEAR) for op in ops):
        info["gemm"] = timing.gemm_tflops(device)
    return info


def _header(info, commit, date) -> str:
    ceilings = ""
    if "copy_gbs" in info:
        empty = "empty kernel" if _device_of(info) == "cuda" else "empty op (torch.neg of one element)"
        ceilings = f"; copy bandwidth {float(info['copy_gbs']):.0f} GB/s, {empty} {float(info['empty_us']):.2f} us"
    if "gemm" in info:
        ceilings += f"; bf16 GEMM {fmt(info['gemm'])} TFLOP/s"
    return f"Device {info['device']}, commit {commit}, {date}{ceilings}."


def _device_of(info) -> str:
    return "cpu" if on_cpu(info["device"]) else "cuda"


def _runnable(impls, device, noted):
    """The impls that run on `device`; a GPU-only peer is left out on the CPU, said once."""
    if device == "cuda":
        return impls
    for name in impls.keys() & GPU_ONLY_PEERS.keys() - noted:
        noted.add(name)
        print(f"cpu: skipping the {GPU_ONLY_PEERS[name]} peers", flush=True)
    return {k: v for k, v in impls.items() if k not in GPU_ONLY_PEERS}


def sweep(ops, tokens_list, hidden_list, device):
    """The (op, tokens, hidden) cases of the ops' sweeps on `device` (or of the given lists)."""
    cases = []
    for op in ops:
        for hidden in hidden_list or SWEEPS[device][op][1]:
            for tokens in tokens_list or SWEEPS[device][op][0]:
                if (device == "cuda" and op in POINTS and not (tokens_list or hidden_list)
                        and (tokens, hidden) not in POINTS[op]):
                    continue  # a sweep of points (decode): the others of the cross product are not in it
                cases.append((op, tokens, hidden))
    return cases


def run(cases, dtype, device, info, failures, only=None):
    """Every (op, tokens, hidden) case on `device`, one row per impl (of `only`, with llmk, when
    given); failures collects what did not run."""
    if device == "cuda":
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 1024)
    rows, noted = [], set()
    for op, tokens, hidden in cases:
        try:
            bytes_moved, make, impls, reference, *flops = OPS[op](tokens, hidden, dtype, device)
            sets = timing.buffer_sets(make, bytes_moved, device)
        except Exception as e:  # noqa: BLE001 - report, go on with the next case
            failures.append(f"{op} {tokens} x {hidden}: {type(e).__name__}: {e}")
            print(f"{op:17s} {tokens:6d} x {hidden:6d}  skipped: {failures[-1]}", flush=True)
            continue
        case_rows, results = [], {}
        if only is not None:
            impls = {k: v for k, v in impls.items() if k == "llmk" or k in only}
        for impl, fn, us, method, err in timing.time_each(
                _runnable(impls, device, noted), sets, device, lambda fn: _max_error(fn, reference, sets[0]),
                f"{op} {tokens} x {hidden}", f"{op:17s} {tokens:6d} x {hidden:6d}", failures):
            results[impl] = us
            case_rows.append(dict(op=op, dtype=str(dtype).replace("torch.", ""), tokens=tokens, hidden=hidden,
                                  impl=impl, time_us=round(us, 3), gbs=sig(bytes_moved / us / 1e3),
                                  pct_copy=round(100 * bytes_moved / us / 1e3 / info["copy_gbs"], 1),
                                  max_rel_err=f"{err:.2e}", timing=method,
                                  copy_gbs=round(info["copy_gbs"]), empty_us=round(info["empty_us"], 3)))
            if getattr(fn, "note", ""):  # what a peer does differently (decode: expanded K/V, ...)
                case_rows[-1]["note"] = fn.note
            if flops:
                gemm = info["gemm"]
                case_rows[-1].update(tflops=sig(flops[0] / us / 1e6),
                                     pct_gemm=round(100 * flops[0] / us / 1e6 / gemm, 1),
                                     gemm_tflops=sig(gemm))
        if "llmk" in results:
            rows += case_rows
            line = "  ".join(f"{k} {v:8.2f}us" for k, v in results.items())
            print(f"{op:17s} {tokens:6d} x {hidden:6d}  {line}", flush=True)
        del sets
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def rebuild(args) -> int:
    """The table and the plot of earlier runs' CSVs (their first CSV's header names the device)."""
    rows, header = [], None
    for path in args.from_csv:
        first, more = views.common.read_csv(path)
        header = header or parse_header(first)
        rows += more
    commit, date, device = header or ("unknown", "unknown", "unknown device")
    info = dict(device=device)
    ceilings = next((r for r in rows if r.get("empty_us") not in (None, "")), None)
    if ceilings:
        info.update(copy_gbs=ceilings["copy_gbs"], empty_us=ceilings["empty_us"])
    gemm = next((r["gemm_tflops"] for r in rows if r.get("gemm_tflops") not in (None, "")), None)
    if gemm:
        info["gemm"] = gemm
    report(_header(info, commit, date) + "\n" + views.markdown(rows, info), rows, info, args)
    return 0


def ab_summary(paths) -> str:
    """An A/B's table from the CSVs of its runs (rows labelled by --variant, base and new, in
    alternated repeats): per case, each variant's llmk times in run order, and the best base
    time over the best new time (above 1: new is faster)."""
    times = {}
    for path in paths:
        with open(path) as f:
            for r in csv.DictReader(line for line in f if not line.startswith("#")):
                if r["impl"] == "llmk":
                    times.setdefault((r["op"], r["dtype"], int(r["tokens"]), int(r["hidden"])), {}).setdefault(
                        r.get("variant") or "-", []).append(float(r["time_us"]))
    lines = ["| op | dtype | tokens x hidden | base us | new us | base / new |", "|---|---|---|---|---|---:|"]
    for (op, dtype, tokens, hidden), by in times.items():
        base, new = by.get("base", []), by.get("new", [])
        ratio = f"{min(base) / min(new):.3f}x" if base and new else "-"
        lines.append(f"| {op} | {dtype} | {tokens} x {hidden} | {' '.join(f'{t:.2f}' for t in base)} | "
                     f"{' '.join(f'{t:.2f}' for t in new)} | {ratio} |")
    return "\n".join(lines)


def report(table, rows, info, args, csv_path=None):
    """Prints the table, writes it and the plot where the arguments ask, and says where every file went."""
    print(table)
    written = []
    if csv_path and rows:
        written.append(f"CSV   {os.path.abspath(csv_path)} ({len(rows)} rows)")
    if args.table:
        with open(args.table, "w") as f:
            f.write(table)
        written.append(f"table {os.path.abspath(args.table)}")
    if args.plot and rows:
        for path in views.plot(rows, args.plot, plot_title(info["device"])):
            written.append(f"plot  {os.path.abspath(path)}")
    if written:
        print(("CPU backend (no GPU found); " if on_cpu(info["device"]) else "") + "wrote:\n  " + "\n  ".join(written))


def write_csv(path, rows, info):
    if path and rows:
        with open(path, "w", newline="") as f:
            f.write(header_line(_commit(), datetime.date.today(), info["device"]))
            writer = csv.DictWriter(f, fieldnames=columns(rows))
            writer.writeheader()
            writer.writerows(rows)


def _offline(argv) -> bool:
    """Handles --from-csv and --ab-summary, which read CSVs and need neither torch nor llmk."""
    parser = argparse.ArgumentParser(add_help=False)
    for flag in ("--from-csv", "--ab-summary"):
        parser.add_argument(flag, nargs="+")
    parser.add_argument("--table")
    parser.add_argument("--plot")
    args, _ = parser.parse_known_args(argv)
    if args.from_csv:
        rebuild(args)
        return True
    if args.ab_summary:
        print(ab_summary(args.ab_summary))
        return True
    return False


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if _offline(argv):
        return 0
    _load()
    parser = argparse.ArgumentParser(prog="python -m llmk_bench")
    parser.add_argument("--op", action="append",
                        choices=sorted([*OPS, GEMM, QLINEAR, ALL_REDUCE, E2E_TP, OVERHEAD, GENERATE]),
                        help="op to benchmark (repeatable); 'overhead': host time per call and eager fwd+bwd")
    parser.add_argument("--all", action="store_true",
                        help=f"every op but {ALL_REDUCE} and {E2E_TP} (several GPUs), and the overhead case")
    parser.add_argument("--tokens", type=int, nargs="*", help="token counts (default: each op's sweep; not overhead)")
    parser.add_argument("--hidden", type=int, nargs="*", help="hidden sizes (default: each op's sweep; not overhead)")
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16",
                        help="the activations' dtype of the per-op sweep (default bfloat16; the CSV's dtype column)")
    parser.add_argument("--csv", help="write every timing here")
    parser.add_argument("--table", help="write the markdown table here")
    parser.add_argument("--plot", help="write a PNG plot here (the gemm and e2e suites' beside it)")
    parser.add_argument("--from-csv", nargs="+", metavar="CSV",
                        help="no timing: rebuild the table and plot from CSVs of earlier runs")
    parser.add_argument("--impls", nargs="*", metavar="IMPL",
                        help="time only these impls of each case besides llmk (e.g. compile liger; none: llmk alone)")
    parser.add_argument("--variant", help="a label for every row (the CSV's variant column): an A/B's base or new")
    parser.add_argument("--ab-summary", nargs="+", metavar="CSV",
                        help="no timing: per case, the variants' llmk times and new over base (tools/gpu_ab.sh)")
    MODULES["gemm"].add_arguments(parser)
    MODULES["quantized"].add_arguments(parser)
    MODULES["distributed"].add_arguments(parser)
    MODULES["e2e"].add_arguments(parser)
    MODULES["generate"].add_arguments(parser)
    MODULES["e2e_tp"].add_arguments(parser)
    args = parser.parse_args(argv)
    ops = [*OPS, GEMM, QLINEAR, OVERHEAD] if args.all or not (args.op or args.e2e) else args.op or []

    device = "cuda" if torch.cuda.is_available() and llmk._C.cuda_device_count() > 0 else "cpu"
    if device == "cpu":
        # llmk's CPU backend runs on one thread: so does torch here, which compares like with
        # like and keeps torch's OpenMP from stalling on a loaded machine (F.rms_norm of 64 x
        # 4096 took 48 ms on 2 busy cores, 1.7 ms on one thread).
        torch.set_num_threads(1)
        print(f"no CUDA GPU found: timing the CPU backend on small shapes, torch on one thread ({CPU_NOTE})",
              flush=True)
    cases = sweep([op for op in ops if op not in (OVERHEAD, GEMM, QLINEAR, ALL_REDUCE, E2E_TP, GENERATE)],
                  args.tokens, args.hidden, device)
    info = machine(device, ops + [op for op, _, _ in cases])
    print(_header(info, _commit(), datetime.date.today()), flush=True)
    failures = []
    rows = run(cases, getattr(torch, args.dtype), device, info, failures,
               set(args.impls) if args.impls is not None else None)
    if GEMM in ops:
        rows += MODULES["gemm"].run(args, torch.bfloat16, device, info, failures)
    if QLINEAR in ops:
        rows += MODULES["quantized"].run(args, torch.bfloat16, device, info, failures)
    if ALL_REDUCE in ops:
        rows += MODULES["distributed"].run(args, device, failures)
    if E2E_TP in ops:
        rows += MODULES["e2e_tp"].run(args, device, failures)
    if "cross_entropy" in ops:  # with it, the fused linear + cross-entropy (GPU only: a note on CPU)
        rows += MODULES["loss"].run_fused_linear_cross_entropy(device, failures)
    if OVERHEAD in ops:
        rows += MODULES["overhead"].run(torch.bfloat16, device, failures)
    if args.e2e or (args.all and device == "cuda"):
        # The CSV is rewritten after every implementation, so that a run cut off keeps what it measured.
        rows += MODULES["e2e"].run(args, device, failures,
                                   lambda e2e_rows: write_csv(args.csv, rows + e2e_rows, info))
    elif args.all:
        print("e2e: not in --all without a GPU (--e2e runs its tiny CPU version)", flush=True)
    if GENERATE in ops or (args.all and device == "cuda"):
        rows += MODULES["generate"].run(args, device, failures,
                                        lambda gen_rows: write_csv(args.csv, rows + gen_rows, info))
    if args.variant:
        for r in rows:
            r["variant"] = args.variant
    write_csv(args.csv, rows, info)
    if failures:
        print(f"{len(failures)} case(s) did not run:\n  " + "\n  ".join(failures))
    report(_header(info, _commit(), datetime.date.today()) + "\n" + views.markdown(rows, info), rows, info, args,
           args.csv)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
