"""The distributed suite's tables and plot (no torch: the docs' report script reads CSVs with them).

Rows: op ``all_reduce_add_rmsnorm``, tokens x hidden per rank, plus ``world`` and ``path`` (the
all-reduce the row took: ``fused``, ``nccl``; ``gloo`` on the CPU); suites/distributed.py times
them. Impls: ``llmk`` (llmk.distributed.all_reduce_add_rmsnorm, its default path),
``llmk_fused`` (the fused kernel forced by LLMK_ALL_REDUCE_PATH, where auto takes another path
and the message fits) and the baseline ``nccl_unfused`` (``gloo_unfused`` on the CPU):
dist.all_reduce, then add_rmsnorm_."""

from .common import as_float, fmt, time_ratio, times

OP = "all_reduce_add_rmsnorm"
BASELINES = ("nccl_unfused", "gloo_unfused")  # the GPU's and the CPU's name of the baseline
COLORS = {"llmk": "tab:blue", "llmk_fused": "tab:cyan", "llmk_one_shot": "tab:green", "llmk_two_shot": "tab:red",
          "nccl_unfused": "tab:orange", "gloo_unfused": "tab:orange"}


def is_distributed_row(row) -> bool:
    return row["op"] == OP


def _cases(rows):
    """{world: {(hidden, tokens): {impl: row}}} in the rows' order."""
    out = {}
    for r in rows:
        if is_distributed_row(r):
            out.setdefault(int(r["world"]), {}).setdefault((int(r["hidden"]), int(r["tokens"])), {})[r["impl"]] = r
    return out


def _baseline(impls):
    return next((impls[b] for b in BASELINES if b in impls), None)


def _us(row) -> str:
    t = as_float(row.get("time_us")) if row else None
    return "-" if t is None else f"{t:.1f}" if t >= 10 else f"{t:.2f}"


def markdown(rows):
    """Per world size, llmk (and the fused path forced) beside the unfused baseline; speedups are
    the baseline's time over the impl's (above 1: faster)."""
    out = []
    for world, by_case in _cases(rows).items():
        some = {i for c in by_case.values() for i in c}
        base = next((b for b in BASELINES if b in some), BASELINES[0])
        forced = "llmk_fused" in some  # the fused path forced where auto did not take it (GPU runs)
        out += [f"\n### {OP}, world {world}: llmk against {base} (dist.all_reduce, then add_rmsnorm_)\n",
                "message: x's bytes per rank; bus GB/s: the all-reduce's bus bandwidth at llmk's time "
                "(2 (world - 1) / world x the message over the time); path: the all-reduce llmk's default takes.\n",
                f"| hidden | tokens | message KiB | path | llmk us | bus GB/s | vs {base} | "
                + (f"llmk_fused us | llmk_fused vs {base} | " if forced else "")
                + f"{base} us | llmk max rel err | " + ("llmk_fused max rel err | " if forced else "")
                + f"{base} max rel err |",
                "|---:|---:|---:|---|---:|---:|---:|" + "---:|---:|" * forced + "---:|---:|" + "---:|" * forced
                + "---:|"]
        notes = {}
        for (hidden, tokens), impls in by_case.items():
            o, f, b = impls.get("llmk"), impls.get("llmk_fused"), _baseline(impls)
            if o is None:
                continue
            fused = f"{_us(f)} | {times(time_ratio(b, f))} | " if forced else ""
            fused_err = f"{f['max_rel_err'] if f else '-'} | " if forced else ""
            out.append(f"| {hidden} | {tokens} | {tokens * hidden * 2 / 1024:g} | {o['path']} | {_us(o)} | "
                       f"{fmt(o.get('gbs'))} | {times(time_ratio(b, o))} | {fused}{_us(b)} | {o['max_rel_err']} | "
                       f"{fused_err}{b['max_rel_err'] if b else '-'} |")
            for name, r in impls.items():
                if r.get("note"):
                    notes.setdefault((name, r["note"]), []).append(f"{tokens} x {hidden}")
        out += [""] + [f"- {name}, {note} ({', '.join(where[:4])}{', ...' if len(where) > 4 else ''})"
                       for (name, note), where in notes.items()] if notes else []
    return out


def plot(rows, path, title=""):
    """Per world size and hidden size, a column of two panels against tokens: each impl's time per
    call, and each impl's speedup over the unfused baseline (filled markers: llmk's default took
    the fused path)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    from .common import panels

    columns = [(world, hidden, {t: c for (h, t), c in by_case.items() if h == hidden})
               for world, by_case in _cases(rows).items() for hidden in dict.fromkeys(h for h, _ in by_case)]
    fig, axes = panels(2, len(columns), (max(3.6 * len(columns), 6.0), 5.6), title)
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for j, (world, hidden, by_tokens) in enumerate(columns):
        tokens = sorted(by_tokens)
        top, bottom = axes[0][j], axes[1][j]
        for impl in dict.fromkeys(i for c in by_tokens.values() for i in c):
            pts = [(t, as_float(by_tokens[t][impl]["time_us"])) for t in tokens if impl in by_tokens[t]]
            top.plot(*zip(*pts), marker="o", ms=3, label=impl, color=COLORS.get(impl))
            if impl in BASELINES:
                continue
            cells = [(t, time_ratio(_baseline(by_tokens[t]), by_tokens[t].get(impl)), by_tokens[t].get(impl))
                     for t in tokens]
            cells = [(t, r, row) for t, r, row in cells if r]
            if cells:
                bottom.plot([c[0] for c in cells], [c[1] for c in cells], color=COLORS.get(impl), label=impl)
                for t, r, row in cells:
                    fused = row["path"] == "fused"
                    bottom.plot(t, r, marker="o", ms=4, color=COLORS.get(impl),
                                markerfacecolor=COLORS.get(impl) if fused else "white")
        top.set_title(f"{OP}\nworld {world}, hidden {hidden}", fontsize=8)
        top.set_ylabel("us per call", fontsize=8)
        top.set_yscale("log")
        top.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        bottom.axhline(1.0, color="gray", lw=0.8)
        bottom.set_ylabel("speedup over the unfused baseline", fontsize=8)
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(plain)
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
            ax.set_xlabel("tokens per rank", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=6)
    fig.savefig(path, dpi=110)
