"""The loss suite's fused linear + cross-entropy table (no torch: the docs' report script reads
CSVs with it). Its rows have their own columns (time_ms, peak_mib, ...: suites/loss.py); the
cross_entropy sweep's rows are the common sweep view's (views/sweep.py)."""

FLCE = "fused_linear_cross_entropy"


def is_fused_linear_cross_entropy_row(row) -> bool:
    return row["op"] == FLCE


def _mib(value) -> str:
    """A MiB cell; empty for rows of CSVs from before the column."""
    return "" if value in (None, "") else f"{float(value):.0f}"


def markdown_fused_linear_cross_entropy(rows):
    rows = [r for r in rows if is_fused_linear_cross_entropy_row(r)]
    out = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        case = [r for r in rows if r["shape"] == shape]
        first = case[0]
        out += [f"\n### {FLCE}: {shape}, {first['tokens']} tokens x H {first['hidden']} x V {first['vocab']} "
                f"{first['dtype']}, forward + backward (dhidden, dweight); transient = peak less the returned "
                "gradients\n",
                "| impl | chunk | ms | peak MiB | transient MiB | fwd ms | fwd peak MiB | loss err | dhidden err "
                "| dweight err |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {r['impl']} | {r['chunk']} | {float(r['time_ms']):.2f} | {float(r['peak_mib']):.0f} | "
                f"{_mib(r.get('transient_mib'))} | {float(r['fwd_ms']):.2f} | {float(r['fwd_peak_mib']):.0f} | "
                f"{r['loss_rel_err']} | {r['dhidden_rel_err']} | {r['dweight_rel_err']} |" for r in case]
    return out
