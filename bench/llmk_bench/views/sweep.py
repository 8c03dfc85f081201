"""The view of the per-op sweeps (every suite's (op, tokens, hidden) cases): a table per op
beside its peers and a figure of GB/s (TFLOP/s for compute-bound ops) against tokens, a panel
per hidden size; the overhead suite's two panels join the figure when its rows are there."""

from . import distributed, e2e, e2e_tp, gemm, generate, loss, overhead, quantized
from .common import fmt, panels

COLORS = {"llmk": "tab:blue", "eager": "tab:orange", "F.rms_norm": "tab:green", "F.layer_norm": "tab:green",
          "torch": "tab:green", "foreach": "tab:orange", "fused": "tab:green", "llmk 2 kernels": "tab:purple",
          "compile": "tab:red", "flash": "tab:orange", "cudnn": "tab:green", "efficient": "tab:gray",
          "llmk_contiguous": "tab:cyan", "llmk_bf16": "tab:purple", "llmk_sm80": "tab:brown",
          "llmk_deterministic": "tab:olive", "liger": "tab:pink"}


def is_sweep_row(row) -> bool:
    return not (overhead.is_overhead_row(row) or e2e.is_e2e_row(row) or gemm.is_gemm_row(row)
                or quantized.is_quantized_row(row) or distributed.is_distributed_row(row)
                or loss.is_fused_linear_cross_entropy_row(row)
                or row["op"] == generate.OP or e2e_tp.is_e2e_tp_row(row))


def _is_decode(op) -> bool:
    return op.startswith("attention_decode")  # tokens = context, hidden = batch


# What tokens and hidden mean in a compute-bound op's rows (default: seqlen, head dim).
FLOPS_AXES = {"attention_paged_prefill": ("chunk", "prefix")}


def _has_flops(rows, op) -> bool:
    return any(r["op"] == op and r.get("tflops") not in (None, "") for r in rows)


def markdown(rows, info):
    """A table per op of the sweep rows (info: the run's empty_us, the 'x launch' column), as markdown lines."""
    out = []
    by_case = {}
    for r in rows:
        if is_sweep_row(r):
            by_case.setdefault((r["op"], r["tokens"], r["hidden"]), {})[r["impl"]] = r
    for op in dict.fromkeys(op for op, _, _ in by_case):
        cases = [(k, v) for k, v in by_case.items() if k[0] == op and "llmk" in v]
        if not cases:
            continue
        peers = [i for i in dict.fromkeys(i for _, impls in cases for i in impls) if i != "llmk"]
        out.append(f"\n### {op}\n")
        if cases[0][1]["llmk"].get("tflops") not in (None, ""):
            out += _flops_table(cases, peers, FLOPS_AXES.get(op, ("seqlen", "head dim")))
            continue
        head = "| context | batch |" if _is_decode(op) else "| tokens | hidden |"
        out.append(head + " llmk us | GB/s | % of copy | x launch | " +
                   " | ".join(f"vs {p}" for p in peers) + " | llmk max rel err |")
        out.append("|---:|---:|---:|---:|---:|---:|" + "---:|" * len(peers) + "---:|")
        for (_, tokens, hidden), impls in cases:
            o = impls["llmk"]
            us = float(o["time_us"])
            speedups = " | ".join(f"{float(impls[p]['time_us']) / us:.2f}x" if p in impls else "-" for p in peers)
            launch = f"{us / float(info['empty_us']):.2f}" if info.get("empty_us") not in (None, "") else "-"
            out.append(f"| {tokens} | {hidden} | {us:.2f} | {fmt(o['gbs'])} | {float(o['pct_copy']):.1f}% | "
                       f"{launch} | {speedups} | {o['max_rel_err']} |")
        notes = dict.fromkeys((i, r["note"]) for _, impls in cases for i, r in impls.items() if r.get("note"))
        out += [""] + [f"- {impl}: {note}" for impl, note in notes] if notes else []
    return out


def _flops_table(cases, peers, axes):
    """Rows of a compute-bound op: tokens and hidden under the names `axes` gives them."""
    lines = [f"| {axes[0]} | {axes[1]} | llmk us | TFLOP/s | % of cuBLAS | " + " | ".join(f"vs {p}" for p in peers) +
             " | " + " | ".join(f"{p} TFLOP/s" for p in peers) + " | llmk max rel err |",
             "|---:|---:|---:|---:|---:|" + "---:|" * (2 * len(peers)) + "---:|"]
    for (_, tokens, hidden), impls in cases:
        o = impls["llmk"]
        speedups = " | ".join(f"{float(impls[p]['time_us']) / float(o['time_us']):.2f}x" if p in impls else "-"
                              for p in peers)
        rates = " | ".join(fmt(impls[p].get("tflops")) if p in impls else "-" for p in peers)
        lines.append(f"| {tokens} | {hidden} | {float(o['time_us']):.1f} | {fmt(o['tflops'])} | "
                     f"{float(o['pct_gemm']):.1f}% | {speedups} | {rates} | {o['max_rel_err']} |")
    return lines


def plot(rows, path, title=""):
    """The sweep rows' figure (and the overhead suite's panels below it when its rows are there)."""
    host = [r for r in rows if overhead.is_overhead_row(r)]
    rows = [r for r in rows if is_sweep_row(r)]
    ops = list(dict.fromkeys(r["op"] for r in rows))
    hiddens = {op: sorted({int(r["hidden"]) for r in rows if r["op"] == op}) for op in ops}
    columns = max([len(h) for h in hiddens.values()] + [2 if host else 1])
    fig, axes = panels(len(ops) + bool(host), columns, (3.2 * columns, 2.6 * len(ops) + 4.5 * bool(host) + 0.6),
                       title)
    for i, op in enumerate(ops):
        flops = _has_flops(rows, op)
        for ax in axes[i][len(hiddens[op]):]:
            ax.axis("off")
        for j, hidden in enumerate(hiddens[op]):
            ax = axes[i][j]
            for impl in dict.fromkeys(r["impl"] for r in rows if r["op"] == op):
                pts = sorted((int(r["tokens"]), float(r["tflops" if flops else "gbs"])) for r in rows
                             if r["op"] == op and int(r["hidden"]) == hidden and r["impl"] == impl)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=impl,
                        color=COLORS.get(impl))
            ax.set_xscale("log")
            title = FLOPS_AXES[op][1] if op in FLOPS_AXES else "batch" if _is_decode(op) else "d"
            ax.set_title(f"{op} {title}={hidden}", fontsize=8)
            ax.tick_params(labelsize=7)
            if j == 0:
                ax.set_ylabel("TFLOP/s" if flops else "GB/s", fontsize=8)
            ax.set_xlabel(FLOPS_AXES[op][0] if op in FLOPS_AXES else "seqlen" if flops else
                          "context" if _is_decode(op) else "tokens", fontsize=8)
        axes[i][0].legend(fontsize=6)
    if host:
        for ax in axes[-1][2:]:
            ax.axis("off")
        overhead.draw(axes[-1][0], axes[-1][1], host)
    fig.savefig(path, dpi=110)
