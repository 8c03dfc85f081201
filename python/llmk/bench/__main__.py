"""python -m llmk.bench --op rmsnorm [--op ...] [--csv F] [--plot F] [--table F]

On a GPU: every case of the op's sweep, llmk beside its peers, in one run; a CSV of all
timings, a markdown table and a plot. Without a GPU: says so and times the CPU backend
on small shapes.
"""

import argparse
import csv
import datetime
import os
import subprocess
import sys

import torch

import llmk
from . import activation_cases, attention_cases, norm_cases, optim_cases, rope_cases, softmax_cases, timing

CASE_MODULES = (norm_cases, activation_cases, softmax_cases, rope_cases, optim_cases, attention_cases)
OPS = {op: case for m in CASE_MODULES for op, case in m.OPS.items()}
# Each op's default sweep: (tokens, hidden) lists; --tokens / --hidden override them.
SWEEPS = {op: sweep for m in CASE_MODULES for op, sweep in m.SWEEPS.items()}


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


def run_gpu(ops, tokens_list, hidden_list, dtype):
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 1024)
    copy_gbs = timing.copy_bandwidth_gbs()
    empty_us = timing.empty_launch_us()
    # The tensor-core ceiling, measured only when a compute-bound op (one that counts FLOPs) runs.
    gemm = timing.gemm_tflops() if any(op in attention_cases.OPS for op in ops) else None
    device = torch.cuda.get_device_name()
    print(f"device {device}; measured copy bandwidth {copy_gbs:.0f} GB/s (read + write); "
          f"empty kernel {empty_us:.2f} us per call" + (f"; bf16 cuBLAS GEMM {gemm:.0f} TFLOP/s" if gemm else ""),
          flush=True)
    rows = []
    for op in ops:
        for hidden in hidden_list or SWEEPS[op][1]:
            for tokens in tokens_list or SWEEPS[op][0]:
                bytes_moved, make, impls, reference, *flops = OPS[op](tokens, hidden, dtype)
                sets = timing.buffer_sets(make, bytes_moved)
                results = {}
                for impl, fn in impls.items():
                    us, method = timing.time_cuda(fn, sets)
                    err = _max_error(fn, reference, sets[0])
                    results[impl] = us
                    rows.append(dict(op=op, dtype=str(dtype).replace("torch.", ""), tokens=tokens, hidden=hidden,
                                     impl=impl, time_us=round(us, 3), gbs=round(bytes_moved / us / 1e3, 1),
                                     pct_copy=round(100 * bytes_moved / us / 1e3 / copy_gbs, 1),
                                     max_rel_err=f"{err:.2e}", timing=method,
                                     copy_gbs=round(copy_gbs), empty_us=round(empty_us, 3)))
                    if flops:
                        rows[-1].update(tflops=round(flops[0] / us / 1e6, 1),
                                        pct_gemm=round(100 * flops[0] / us / 1e6 / gemm, 1), gemm_tflops=round(gemm))
                line = "  ".join(f"{k} {v:8.2f}us" for k, v in results.items())
                print(f"{op:17s} {tokens:6d} x {hidden:6d}  {line}", flush=True)
                del sets
                torch.cuda.empty_cache()
    return rows, dict(device=device, copy_gbs=copy_gbs, empty_us=empty_us)


def run_cpu(ops):
    print("no CUDA GPU found: timing the CPU reference backend on small shapes (CPU timings)")
    rows = []
    for tokens in (1, 16, 128):
        for hidden in (896, 4096):
            x = torch.randn(tokens, hidden)
            w = torch.randn(hidden)
            ours = timing.time_cpu(lambda a, b: llmk.rmsnorm(a, b), (x, w))
            eager = timing.time_cpu(norm_cases.hf_rmsnorm, (x, w))
            print(f"rmsnorm cpu {tokens:4d} x {hidden:5d}: llmk {ours:9.1f} us, eager {eager:9.1f} us")
            for impl, us in (("llmk", ours), ("eager", eager)):
                rows.append(dict(op="rmsnorm", dtype="float32", tokens=tokens, hidden=hidden, impl=impl,
                                 time_us=round(us, 1), timing="cpu"))
    return rows


def markdown_table(rows, info) -> str:
    out = []
    by_case = {}
    for r in rows:
        by_case.setdefault((r["op"], r["tokens"], r["hidden"]), {})[r["impl"]] = r
    ops = list(dict.fromkeys(r["op"] for r in rows))
    for op in ops:
        cases = [(k, v) for k, v in by_case.items() if k[0] == op]
        peers = [i for i in cases[0][1] if i != "llmk"]
        out.append(f"\n### {op}\n")
        if "tflops" in cases[0][1]["llmk"]:
            out += _flops_table(cases, peers)
            continue
        out.append("| tokens | hidden | llmk us | GB/s | % of copy | x launch | " +
                   " | ".join(f"vs {p}" for p in peers) + " | llmk max rel err |")
        out.append("|---:|---:|---:|---:|---:|---:|" + "---:|" * len(peers) + "---:|")
        for (_, tokens, hidden), impls in cases:
            o = impls["llmk"]
            speedups = " | ".join(f"{impls[p]['time_us'] / o['time_us']:.2f}x" for p in peers)
            out.append(f"| {tokens} | {hidden} | {o['time_us']:.2f} | {o['gbs']:.0f} | {o['pct_copy']:.1f}% | "
                       f"{o['time_us'] / info['empty_us']:.2f} | {speedups} | {o['max_rel_err']} |")
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
        rates = " | ".join(f"{float(impls[p]['tflops']):.0f}" if p in impls else "-" for p in peers)
        lines.append(f"| {tokens} | {hidden} | {float(o['time_us']):.1f} | {float(o['tflops']):.0f} | "
                     f"{float(o['pct_gemm']):.1f}% | {speedups} | {rates} | {o['max_rel_err']} |")
    return lines


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(dict.fromkeys(r["op"] for r in rows))
    hiddens = {op: sorted({int(r["hidden"]) for r in rows if r["op"] == op}) for op in ops}
    columns = max(len(h) for h in hiddens.values())
    colors = {"llmk": "tab:blue", "eager": "tab:orange", "F.rms_norm": "tab:green", "F.layer_norm": "tab:green",
              "torch": "tab:green", "foreach": "tab:orange", "fused": "tab:green", "llmk 2 kernels": "tab:purple",
              "compile": "tab:red", "flash": "tab:orange", "cudnn": "tab:green", "efficient": "tab:gray"}
    fig, axes = plt.subplots(len(ops), columns, figsize=(3.2 * columns, 2.8 * len(ops)), squeeze=False)
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
            ax.set_title(f"{op} d={hidden}", fontsize=8)
            ax.tick_params(labelsize=7)
            if j == 0:
                ax.set_ylabel("TFLOP/s" if _has_flops(rows, op) else "GB/s", fontsize=8)
            if i == len(ops) - 1 or j >= len(hiddens[ops[i + 1]]):
                ax.set_xlabel("seqlen" if _has_flops(rows, op) else "tokens", fontsize=8)
        axes[i][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _has_flops(rows, op) -> bool:
    return any(r["op"] == op and r.get("tflops") not in (None, "") for r in rows)


def rebuild(args) -> int:
    rows, header = [], ""
    for path in args.from_csv:
        with open(path) as f:
            header = f.readline().lstrip("# ").strip()
            rows += list(csv.DictReader(f))
    for r in rows:
        for key in ("time_us", "gbs", "pct_copy", "empty_us"):
            r[key] = float(r[key])
    info = {"empty_us": rows[0]["empty_us"]}
    order = {op: i for i, op in enumerate(OPS)}
    rows.sort(key=lambda r: order.get(r["op"], len(order)))  # stable: keeps each op's sweep order
    table = (f"{header}; copy bandwidth {rows[0]['copy_gbs']} GB/s, empty kernel {rows[0]['empty_us']} us.\n"
             + markdown_table(rows, info))
    report(table, rows, args)
    return 0


def report(table, rows, args):
    """Prints the table and writes it and the plot where the arguments ask."""
    print(table)
    if args.table:
        with open(args.table, "w") as f:
            f.write(table)
    if args.plot:
        plot(rows, args.plot)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m llmk.bench")
    parser.add_argument("--op", action="append", choices=sorted(OPS), help="op to benchmark (repeatable)")
    parser.add_argument("--all", action="store_true", help="every op")
    parser.add_argument("--tokens", type=int, nargs="*", help="token counts (default: each op's sweep)")
    parser.add_argument("--hidden", type=int, nargs="*", help="hidden sizes (default: each op's sweep)")
    parser.add_argument("--csv", help="write every timing here")
    parser.add_argument("--table", help="write the markdown table here")
    parser.add_argument("--plot", help="write a PNG plot here")
    parser.add_argument("--from-csv", nargs="+", metavar="CSV",
                        help="no timing: rebuild the table and plot from CSVs of earlier runs")
    args = parser.parse_args(argv)
    ops = list(OPS) if args.all or not args.op else args.op

    if args.from_csv:
        return rebuild(args)

    if not (torch.cuda.is_available() and llmk._C.cuda_device_count() > 0):
        rows = run_cpu(ops)
        info = None
    else:
        rows, info = run_gpu(ops, args.tokens, args.hidden, torch.bfloat16)
    if args.csv and rows:
        with open(args.csv, "w", newline="") as f:
            f.write(f"# llmk benchmark; commit {_commit()}; {datetime.date.today()}; "
                    f"{info['device'] if info else 'cpu'}\n")
            writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
            writer.writeheader()
            writer.writerows(rows)
    if info:
        table = (f"Device {info['device']}, commit {_commit()}, {datetime.date.today()}; copy bandwidth "
                 f"{info['copy_gbs']:.0f} GB/s, empty kernel {info['empty_us']:.2f} us.\n" + markdown_table(rows, info))
        report(table, rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
