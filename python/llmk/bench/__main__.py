"""python -m llmk.bench --op rmsnorm [--op ...] [--all] [--dtype float16] [--csv F] [--plot F] [--table F]
python -m llmk.bench --op gemm [--gemm-shapes ...] [--gemm-m ...] [--gemm-parts ...]
python -m llmk.bench --e2e [--e2e-families ...] [--e2e-layers N] [--e2e-phases ...] [--e2e-impls ...]
python -m llmk.bench --gaps [--csv F] [--plot F] [--table F]
python -m llmk.bench --from-csv A.csv [B.csv ...] [--table F] [--plot F]
python -m llmk.bench --op rmsnorm --tokens 8192 --hidden 4096 --impls [IMPL ...] --variant base --csv F
python -m llmk.bench --ab-summary A.csv [B.csv ...]

On a GPU: every case of the op's sweep, llmk beside its peers, in one run; a CSV of all
timings, a markdown table and a plot. Without a GPU: the same cases on the CPU backend at
small shapes (each module's CPU_SWEEPS), beside the same peers where they run on the CPU
(torch.compile and the GPU-only SDPA backends are skipped, with a note), written the same
way; the table's header says that it is the CPU backend and that no GPU was found.
`--op overhead` (also in --all) is what an eager PyTorch user pays per call: see
overhead_cases.py. `--op gemm` (also in --all) is the GEMM family, llmk.linear against cuBLAS
over real models' weight shapes, the fused epilogues and rmsnorm_linear, with its own
trimming flags: see gemm_cases.py. `--e2e` (in --all on a GPU) times whole Hugging Face
models, eager against torch.compile, Liger-Kernel and llmk.patch: see e2e_cases.py. `--gaps`
runs only the rows of GAPS, where issue 16's sweep found llmk behind torch.compile or
Liger-Kernel (Liger is a peer wherever it has the op and imports: liger_peers.py). `--impls`
keeps llmk and the named peers (none: llmk alone), `--variant` labels the rows, and
`--ab-summary` compares the labelled runs of an A/B (tools/gpu_ab.sh builds the base and the
new tree and alternates them). A case
that fails (an op not built, a peer that does not run) is reported and skipped; the run then
exits with status 1 after writing what it measured.
"""

import argparse
import csv
import datetime
import os
import platform
import subprocess
import sys

import torch

import llmk
from . import (activation_cases, attention_cases, chain_cases, decode_cases, e2e_cases, gemm_cases, loss_cases,
               norm_cases, optim_cases, overhead_cases, rope_cases, softmax_cases, timing)

CASE_MODULES = (norm_cases, activation_cases, softmax_cases, rope_cases, optim_cases, loss_cases, attention_cases,
                decode_cases, chain_cases)
OPS = {op: case for m in CASE_MODULES for op, case in m.OPS.items()}
# Each op's default sweep per device: (tokens, hidden) lists; --tokens / --hidden override them.
SWEEPS = {"cuda": {op: sweep for m in CASE_MODULES for op, sweep in m.SWEEPS.items()},
          "cpu": {op: sweep for m in CASE_MODULES for op, sweep in m.CPU_SWEEPS.items()}}
# Ops whose GPU sweep is a list of (tokens, hidden) points rather than the cross product of SWEEPS
# (decode: batch x context); --tokens / --hidden run the cross product.
POINTS = {op: set(points) for m in CASE_MODULES for op, points in getattr(m, "POINTS", {}).items()}
# Issue 16's rows, (op, tokens, hidden): where llmk trailed torch.compile or Liger-Kernel.
GAPS = ([("rmsnorm", 8192, 4096), ("rmsnorm", 8192, 8192), ("rmsnorm", 32768, 5120), ("rmsnorm", 4096, 16384)]
        + [(op, 8192, h) for op in ("layernorm", "layernorm_train") for h in (4096, 1024)]
        + [("softmax", 1, 128256), ("softmax", 16, 151936), ("swiglu", 16, 14336), ("rope_train", 8192, 4096),
           ("rmsnorm_swiglu", 65536, 4096)]
        + [("bias_gelu_backward", t, h) for h in (3072, 16384) for t in (16, 2048, 4096, 8192)])
OVERHEAD = "overhead"
GEMM = "gemm"  # its own sweep over (M, N, K) and fused forms: gemm_cases.run
# Peers that the CPU run leaves out, and why.
GPU_ONLY_PEERS = {"compile": "torch.compile (Inductor's CPU backend compiles C++ per shape: minutes for a sweep)"}
CPU_NOTE = "CPU backend: no CUDA GPU found"


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
    if any(op in OPS or op == GEMM for op in ops):
        info.update(copy_gbs=timing.copy_bandwidth_gbs(device), empty_us=timing.empty_launch_us(device))
    # The tensor-core ceiling, measured only when a compute-bound op (one that counts FLOPs) runs.
    if any(op in attention_cases.OPS or op == GEMM for op in ops):
        info["gemm"] = timing.gemm_tflops(device)
    return info


def _header(info, commit, date) -> str:
    ceilings = ""
    if "copy_gbs" in info:
        empty = "empty kernel" if _device_of(info) == "cuda" else "empty op (torch.neg of one element)"
        ceilings = f"; copy bandwidth {float(info['copy_gbs']):.0f} GB/s, {empty} {float(info['empty_us']):.2f} us"
    if "gemm" in info:
        ceilings += f"; bf16 GEMM {_fmt(info['gemm'])} TFLOP/s"
    return f"Device {info['device']}, commit {commit}, {date}{ceilings}."


def _device_of(info) -> str:
    return "cpu" if CPU_NOTE in info["device"] else "cuda"


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
        for impl, fn in _runnable(impls, device, noted).items():
            try:
                us, method = timing.time_op(fn, sets, device)
                err = _max_error(fn, reference, sets[0])
            except Exception as e:  # noqa: BLE001
                failures.append(f"{op} {tokens} x {hidden} {impl}: {type(e).__name__}: {e}")
                print(f"{op:17s} {tokens:6d} x {hidden:6d}  {impl} failed: {failures[-1]}", flush=True)
                if impl == "llmk":
                    break
                continue
            results[impl] = us
            case_rows.append(dict(op=op, dtype=str(dtype).replace("torch.", ""), tokens=tokens, hidden=hidden,
                                  impl=impl, time_us=round(us, 3), gbs=_sig(bytes_moved / us / 1e3),
                                  pct_copy=round(100 * bytes_moved / us / 1e3 / info["copy_gbs"], 1),
                                  max_rel_err=f"{err:.2e}", timing=method,
                                  copy_gbs=round(info["copy_gbs"]), empty_us=round(info["empty_us"], 3)))
            if getattr(fn, "note", ""):  # what a peer does differently (decode: expanded K/V, ...)
                case_rows[-1]["note"] = fn.note
            if flops:
                gemm = info["gemm"]
                case_rows[-1].update(tflops=_sig(flops[0] / us / 1e6),
                                     pct_gemm=round(100 * flops[0] / us / 1e6 / gemm, 1),
                                     gemm_tflops=_sig(gemm))
        if "llmk" in results:
            rows += case_rows
            line = "  ".join(f"{k} {v:8.2f}us" for k, v in results.items())
            print(f"{op:17s} {tokens:6d} x {hidden:6d}  {line}", flush=True)
        del sets
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def markdown_table(rows, info) -> str:
    out = []
    by_case = {}
    for r in rows:
        if not (overhead_cases.is_overhead_row(r) or e2e_cases.is_e2e_row(r) or gemm_cases.is_gemm_row(r)
                or loss_cases.is_fused_linear_cross_entropy_row(r)):
            by_case.setdefault((r["op"], r["tokens"], r["hidden"]), {})[r["impl"]] = r
    ops = list(dict.fromkeys(op for op, _, _ in by_case))
    for op in ops:
        cases = [(k, v) for k, v in by_case.items() if k[0] == op]
        peers = [i for i in dict.fromkeys(i for _, impls in cases for i in impls) if i != "llmk"]
        out.append(f"\n### {op}\n")
        if cases[0][1]["llmk"].get("tflops") not in (None, ""):
            out += _flops_table(cases, peers)
            continue
        columns = "| context | batch |" if op in decode_cases.OPS else "| tokens | hidden |"
        out.append(columns + " llmk us | GB/s | % of copy | x launch | " +
                   " | ".join(f"vs {p}" for p in peers) + " | llmk max rel err |")
        out.append("|---:|---:|---:|---:|---:|---:|" + "---:|" * len(peers) + "---:|")
        for (_, tokens, hidden), impls in cases:
            o = impls["llmk"]
            speedups = " | ".join(f"{impls[p]['time_us'] / o['time_us']:.2f}x" if p in impls else "-" for p in peers)
            out.append(f"| {tokens} | {hidden} | {o['time_us']:.2f} | {_fmt(o['gbs'])} | {o['pct_copy']:.1f}% | "
                       f"{o['time_us'] / info['empty_us']:.2f} | {speedups} | {o['max_rel_err']} |")
        notes = dict.fromkeys((i, r["note"]) for _, impls in cases for i, r in impls.items() if r.get("note"))
        out += [""] + [f"- {impl}: {note}" for impl, note in notes] if notes else []
    out += gemm_cases.markdown(rows)
    out += loss_cases.markdown_fused_linear_cross_entropy(rows)
    out += overhead_cases.markdown(rows)
    out += e2e_cases.markdown(rows)
    return "\n".join(out) + "\n"


def _flops_table(cases, peers):
    """Rows of a compute-bound op: tokens is the sequence length, hidden the head dim."""
    lines = ["| seqlen | head dim | llmk us | TFLOP/s | % of cuBLAS | " + " | ".join(f"vs {p}" for p in peers) +
             " | " + " | ".join(f"{p} TFLOP/s" for p in peers) + " | llmk max rel err |",
             "|---:|---:|---:|---:|---:|" + "---:|" * (2 * len(peers)) + "---:|"]
    for (_, tokens, hidden), impls in cases:
        o = impls["llmk"]
        speedups = " | ".join(f"{float(impls[p]['time_us']) / float(o['time_us']):.2f}x" if p in impls else "-"
                              for p in peers)
        rates = " | ".join(_fmt(impls[p]["tflops"]) if p in impls else "-" for p in peers)
        lines.append(f"| {tokens} | {hidden} | {float(o['time_us']):.1f} | {_fmt(o['tflops'])} | "
                     f"{float(o['pct_gemm']):.1f}% | {speedups} | {rates} | {o['max_rel_err']} |")
    return lines


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    e2e = [r for r in rows if e2e_cases.is_e2e_row(r)]
    gemm = [r for r in rows if gemm_cases.is_gemm_row(r)]
    overhead = [r for r in rows if overhead_cases.is_overhead_row(r)]
    rows = [r for r in rows if not overhead_cases.is_overhead_row(r) and not e2e_cases.is_e2e_row(r)
            and not gemm_cases.is_gemm_row(r) and not loss_cases.is_fused_linear_cross_entropy_row(r)]
    root, ext = os.path.splitext(path)
    if gemm:  # its own figure: beside the others' as <name>_gemm.png
        gemm_cases.plot(gemm, path if not (rows or overhead or e2e) else f"{root}_gemm{ext or '.png'}")
    if e2e:  # its own figure: beside the others' as <name>_e2e.png
        e2e_cases.plot(e2e, path if not (rows or overhead) else f"{root}_e2e{ext or '.png'}")
    if not (rows or overhead):
        return
    ops = list(dict.fromkeys(r["op"] for r in rows))
    hiddens = {op: sorted({int(r["hidden"]) for r in rows if r["op"] == op}) for op in ops}
    columns = max([len(h) for h in hiddens.values()] + [2 if overhead else 1])
    colors = {"llmk": "tab:blue", "eager": "tab:orange", "F.rms_norm": "tab:green", "F.layer_norm": "tab:green",
              "torch": "tab:green", "foreach": "tab:orange", "fused": "tab:green", "llmk 2 kernels": "tab:purple",
              "compile": "tab:red", "flash": "tab:orange", "cudnn": "tab:green", "efficient": "tab:gray",
              "llmk_contiguous": "tab:cyan", "llmk_bf16": "tab:purple", "llmk_sm80": "tab:brown",
              "llmk_deterministic": "tab:olive", "liger": "tab:pink"}
    fig, axes = plt.subplots(len(ops) + bool(overhead), columns,
                             figsize=(3.2 * columns, 2.8 * len(ops) + 4.5 * bool(overhead)), squeeze=False)
    for i, op in enumerate(ops):
        for ax in axes[i][len(hiddens[op]):]:
            ax.axis("off")
        for j, hidden in enumerate(hiddens[op]):
            ax = axes[i][j]
            for impl in dict.fromkeys(r["impl"] for r in rows if r["op"] == op):
                metric = "tflops" if _has_flops(rows, op) else "gbs"
                pts = sorted((int(r["tokens"]), float(r[metric])) for r in rows
                             if r["op"] == op and int(r["hidden"]) == hidden and r["impl"] == impl)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=impl,
                        color=colors.get(impl))
            ax.set_xscale("log")
            ax.set_title(f"{op} {'batch' if op in decode_cases.OPS else 'd'}={hidden}", fontsize=8)
            ax.tick_params(labelsize=7)
            if j == 0:
                ax.set_ylabel("TFLOP/s" if _has_flops(rows, op) else "GB/s", fontsize=8)
            if i == len(ops) - 1 or j >= len(hiddens[ops[i + 1]]):
                ax.set_xlabel("seqlen" if _has_flops(rows, op) else "context" if op in decode_cases.OPS else "tokens",
                              fontsize=8)
        axes[i][0].legend(fontsize=6)
    if overhead:
        for ax in axes[-1][2:]:
            ax.axis("off")
        overhead_cases.plot(axes[-1][0], axes[-1][1], overhead)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _fmt(rate) -> str:
    """A rate in the table: whole numbers on the GPU, two significant digits below 10 (CPU rows)."""
    rate = float(rate)
    return f"{rate:.0f}" if rate >= 10 else f"{rate:.2g}"


def _sig(value: float) -> float:
    """A rate for the CSV: 0.1 resolution, three significant digits below 10 (CPU rows)."""
    return round(value, 1) if value >= 10 else float(f"{value:.3g}")


def _has_flops(rows, op) -> bool:
    return any(r["op"] == op and r.get("tflops") not in (None, "") for r in rows)


def rebuild(args) -> int:
    """The table and the plot of earlier runs' CSVs (their first CSV's header names the device)."""
    rows, header = [], ""
    for path in args.from_csv:
        with open(path) as f:
            first = f.readline().lstrip("# ").strip()
            header = header or first
            rows += list(csv.DictReader(f))
    for r in rows:
        for key in ("time_us", "gbs", "pct_copy", "empty_us", "copy_gbs"):
            if r.get(key) not in (None, ""):
                r[key] = float(r[key])
    # "llmk benchmark; commit C; date; device"
    _, commit, date, device = [s.strip() for s in header.split(";", 3)]
    info = dict(device=device)
    ceilings = next((r for r in rows if r.get("empty_us") not in (None, "")), None)
    if ceilings:
        info.update(copy_gbs=ceilings["copy_gbs"], empty_us=ceilings["empty_us"])
    gemm = next((r["gemm_tflops"] for r in rows if r.get("gemm_tflops") not in (None, "")), None)
    if gemm:
        info["gemm"] = gemm
    order = {op: i for i, op in enumerate(OPS)}
    rows.sort(key=lambda r: order.get(r["op"], len(order)))  # stable: keeps each op's sweep order
    report(_header(info, commit.removeprefix("commit "), date) + "\n" + markdown_table(rows, info), rows, args)
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


def report(table, rows, args):
    """Prints the table and writes it and the plot where the arguments ask."""
    print(table)
    if args.table:
        with open(args.table, "w") as f:
            f.write(table)
    if args.plot and rows:
        plot(rows, args.plot)


def write_csv(path, rows, info):
    if path and rows:
        with open(path, "w", newline="") as f:
            f.write(f"# llmk benchmark; commit {_commit()}; {datetime.date.today()}; {info['device']}\n")
            writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
            writer.writeheader()
            writer.writerows(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m llmk.bench")
    parser.add_argument("--op", action="append", choices=sorted([*OPS, GEMM, OVERHEAD]),
                        help="op to benchmark (repeatable); 'overhead': host time per call and eager fwd+bwd")
    parser.add_argument("--all", action="store_true", help="every op, and the overhead case")
    parser.add_argument("--tokens", type=int, nargs="*", help="token counts (default: each op's sweep; not overhead)")
    parser.add_argument("--hidden", type=int, nargs="*", help="hidden sizes (default: each op's sweep; not overhead)")
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16",
                        help="the activations' dtype of the per-op sweep (default bfloat16; the CSV's dtype column)")
    parser.add_argument("--csv", help="write every timing here")
    parser.add_argument("--table", help="write the markdown table here")
    parser.add_argument("--plot", help="write a PNG plot here")
    parser.add_argument("--gaps", action="store_true",
                        help="only issue 16's rows where llmk trailed torch.compile or Liger-Kernel (GAPS)")
    parser.add_argument("--from-csv", nargs="+", metavar="CSV",
                        help="no timing: rebuild the table and plot from CSVs of earlier runs")
    parser.add_argument("--impls", nargs="*", metavar="IMPL",
                        help="time only these impls of each case besides llmk (e.g. compile liger; none: llmk alone)")
    parser.add_argument("--variant", help="a label for every row (the CSV's variant column): an A/B's base or new")
    parser.add_argument("--ab-summary", nargs="+", metavar="CSV",
                        help="no timing: per case, the variants' llmk times and new over base (tools/gpu_ab.sh)")
    gemm_cases.add_arguments(parser)
    e2e_cases.add_arguments(parser)
    args = parser.parse_args(argv)
    ops = [*OPS, GEMM, OVERHEAD] if args.all or not (args.op or args.e2e or args.gaps) else args.op or []

    if args.from_csv:
        return rebuild(args)
    if args.ab_summary:
        print(ab_summary(args.ab_summary))
        return 0

    device = "cuda" if torch.cuda.is_available() and llmk._C.cuda_device_count() > 0 else "cpu"
    if device == "cpu":
        # llmk's CPU backend runs on one thread: so does torch here, which compares like with
        # like and keeps torch's OpenMP from stalling on a loaded machine (F.rms_norm of 64 x
        # 4096 took 48 ms on 2 busy cores, 1.7 ms on one thread).
        torch.set_num_threads(1)
        print(f"no CUDA GPU found: timing the CPU backend on small shapes, torch on one thread ({CPU_NOTE})",
              flush=True)
    cases = sweep([op for op in ops if op not in (OVERHEAD, GEMM)], args.tokens, args.hidden, device)
    if args.gaps:
        cases += GAPS if device == "cuda" else sweep(list(dict.fromkeys(op for op, _, _ in GAPS)), None, None, device)
    info = machine(device, ops + [op for op, _, _ in cases])
    print(_header(info, _commit(), datetime.date.today()), flush=True)
    failures = []
    rows = run(cases, getattr(torch, args.dtype), device, info, failures,
               set(args.impls) if args.impls is not None else None)
    if GEMM in ops:
        rows += gemm_cases.run(args, torch.bfloat16, device, info, failures)
    if "cross_entropy" in ops:  # with it, the fused linear + cross-entropy (GPU only: a note on CPU)
        rows += loss_cases.run_fused_linear_cross_entropy(device, failures)
    if OVERHEAD in ops:
        rows += overhead_cases.run(torch.bfloat16, device, failures)
    if args.e2e or (args.all and device == "cuda"):
        # The CSV is rewritten after every implementation, so that a run cut off keeps what it measured.
        rows += e2e_cases.run(args, device, failures, lambda e2e_rows: write_csv(args.csv, rows + e2e_rows, info))
    elif args.all:
        print("e2e: not in --all without a GPU (--e2e runs its tiny CPU version)", flush=True)
    if args.variant:
        for r in rows:
            r["variant"] = args.variant
    write_csv(args.csv, rows, info)
    report(_header(info, _commit(), datetime.date.today()) + "\n" + markdown_table(rows, info), rows, args)
    if failures:
        print(f"{len(failures)} case(s) did not run:\n  " + "\n  ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
