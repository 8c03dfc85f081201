"""The quantized suite's tables and plot (no torch: the docs' report script reads CSVs with them).

Rows: op ``quantized_linear``, tokens = M, hidden = N, plus ``k``, ``bits``, ``group`` (K: one
scale per output channel) and ``shape``; suites/quantized.py times them. Impls: ``llmk``
(llmk.quantized_linear, its default path), ``llmk_stream`` / ``llmk_dequant`` (the two paths
forced by LLMK_QUANTIZED_PATH, at a few M around the switch), the dense baseline
``cublas_bf16`` (``torch_bf16`` on the CPU: F.linear on the dequantized weight) and torch's
integer-weight ops: ``tinygemm`` (``torch._weight_int4pack_mm``; ``int4pack``, its CPU form,
on the CPU) and ``int8pack`` (``torch._weight_int8pack_mm``)."""

from .common import as_float, fmt, time_ratio, times, verdict

OP = "quantized_linear"
DENSE = ("cublas_bf16", "torch_bf16")  # the GPU's and the CPU's name of the dense baseline
INT_PEERS = {4: ("tinygemm", "int4pack"), 8: ("int8pack",)}  # torch's integer-weight op of each width
PATHS = ("llmk_stream", "llmk_dequant")
COLORS = {"llmk": "tab:blue", "llmk_stream": "tab:cyan", "llmk_dequant": "tab:purple", "tinygemm": "tab:red",
          "int4pack": "tab:red", "int8pack": "tab:orange"}


def is_quantized_row(row) -> bool:
    return row["op"] == OP


def format_name(bits, group, k) -> str:
    """'int4 g128', 'int8 per channel' (group = K)."""
    return f"int{int(bits)} " + ("per channel" if int(group) == int(k) else f"g{int(group)}")


def _cases(rows):
    """{format name: {(shape, M, N, K): {impl: row}}} in the rows' order."""
    out = {}
    for r in rows:
        if is_quantized_row(r):
            fmt_name = format_name(r["bits"], r["group"], r["k"])
            out.setdefault(fmt_name, {}).setdefault((r["shape"], int(r["tokens"]), int(r["hidden"]), int(r["k"])),
                                                    {})[r["impl"]] = r
    return out


def _first(impls, names):
    """The row of the first of `names` that the case has (None if none)."""
    return next((impls[n] for n in names if n in impls), None)


def _us(row) -> str:
    t = as_float(row.get("time_us")) if row else None
    return "-" if t is None else f"{t:.1f}" if t >= 10 else f"{t:.2f}"


def _bits(case) -> int:
    return int(next(iter(case.values()))["bits"])


def markdown(rows):
    """The suite's tables: per format, llmk beside the dense baseline and torch's integer op; then
    the two paths around the switch. Speedups are the peer's time over llmk's (above 1: llmk is
    faster)."""
    cases = _cases(rows)
    out = []
    notes = {}
    for fmt_name, by_case in cases.items():
        bits = _bits(next(iter(by_case.values())))
        some = [i for c in by_case.values() for i in c]
        dense = next((d for d in DENSE if d in some), DENSE[0])
        peer = next((p for p in INT_PEERS.get(bits, ()) if p in some), INT_PEERS.get(bits, ("-",))[0])
        out += [f"\n### quantized_linear {fmt_name}: llmk against {dense} (the bf16 dequantized weight) and {peer}\n",
                "weight GB/s: the impl's weight bytes (codes, scales and zeros; bf16 for the dense baseline) over "
                "its time, M <= 64 only; % of copy: that over the run's copy bandwidth.\n",
                f"| shape | M | N | K | llmk us | weight GB/s | % of copy | TFLOP/s | {dense} us | vs {dense} | "
                f"{peer} us | vs {peer} | llmk fastest | llmk max rel err | {peer} max rel err |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
        for (shape, m, n, k), impls in by_case.items():
            o = impls.get("llmk")
            if o is None:
                continue
            d, p = impls.get(dense), impls.get(peer)
            vs_dense, vs_peer = time_ratio(d, o), time_ratio(p, o)
            ratios = [r for r in (vs_dense, vs_peer) if r]
            fastest = verdict(all(r >= 1 for r in ratios)) if ratios else "-"
            out.append(f"| {shape} | {m} | {n} | {k} | {_us(o)} | {fmt(o.get('gbs'))} | "
                       f"{fmt(o.get('pct_copy')) if o.get('pct_copy') not in (None, '') else '-'} | "
                       f"{fmt(o.get('tflops'))} | {_us(d)} | {times(vs_dense)} | {_us(p)} | {times(vs_peer)} | "
                       f"{fastest} | {o['max_rel_err']} | {p['max_rel_err'] if p else '-'} |")
            for name, r in impls.items():
                if r.get("note"):
                    notes.setdefault((name, r["note"]), []).append(f"{shape} M={m}")
    paths = [(f, key, impls) for f, by_case in cases.items() for key, impls in by_case.items()
             if any(p in impls for p in PATHS)]
    if paths:
        out += ["\n### quantized_linear: the two paths forced (LLMK_QUANTIZED_PATH=stream / dequant) beside the "
                "default's choice\n",
                "| format | shape | M | N | K | llmk (default) us | stream us | dequant us | dequant / stream | "
                "faster path | default within 5% of it |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
        for fmt_name, (shape, m, n, k), impls in paths:
            o, s, q = impls.get("llmk"), impls.get("llmk_stream"), impls.get("llmk_dequant")
            ratio = time_ratio(q, s)
            best = min((r for r in (s, q) if r), key=lambda r: float(r["time_us"]))
            within = time_ratio(o, best)
            out.append(f"| {fmt_name} | {shape} | {m} | {n} | {k} | {_us(o)} | {_us(s)} | {_us(q)} | {times(ratio)} | "
                       f"{best['impl'].removeprefix('llmk_')} | {verdict(within <= 1.05) if within else '-'} |")
    if notes:
        out.append("")
        out += [f"- {name}, {note} ({', '.join(where[:4])}{', ...' if len(where) > 4 else ''})"
                for (name, note), where in notes.items()]
    return out


def plot(rows, path, title=""):
    """Per format and weight shape, each impl's speedup over the dense baseline (its time over the
    impl's; above 1: faster than the bf16 weight) against M."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    from .common import figure

    cases = _cases(rows)
    panels = [(f, shape) for f, by_case in cases.items() for shape in dict.fromkeys(s for s, _, _, _ in by_case)]
    columns = min(4, max(len(panels), 1))
    lines = max(1, -(-len(panels) // columns))
    fig = figure((3.6 * columns, 2.9 * lines), title)
    grid = fig.add_gridspec(lines, columns)
    for place, (fmt_name, shape) in enumerate(panels):
        ax = fig.add_subplot(grid[place // columns, place % columns])
        mine = {key: impls for key, impls in cases[fmt_name].items() if key[0] == shape}
        impls = [i for i in dict.fromkeys(i for c in mine.values() for i in c) if i not in DENSE]
        for impl in impls:
            pts = []
            for (_, m, _, _), c in sorted(mine.items(), key=lambda kv: kv[0][1]):
                ratio = time_ratio(_first(c, DENSE), c.get(impl))
                if ratio:
                    pts.append((m, ratio))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=impl,
                        color=COLORS.get(impl), ls="--" if impl in PATHS else "-")
        n, k = next((n, k) for (_, _, n, k) in mine)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.set_title(f"{fmt_name}: {shape}\nN={n}, K={k}", fontsize=8)
        ax.set_xlabel("M", fontsize=8)
        ax.set_ylabel("speedup over bf16 weight", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    fig.savefig(path, dpi=110)
