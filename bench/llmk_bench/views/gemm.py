"""The gemm suite's tables and plot (no torch: the docs' report script reads CSVs with them).
Rows: tokens = M, hidden = N, plus k and shape (suites/gemm.py times them)."""

OPS = ("gemm", "gemm_bias", "gemm_residual", "gemm_silu_mul", "gemm_gelu", "rmsnorm_linear", "gemm_train")
COLORS = {"llmk": "tab:blue", "cublas": "tab:green", "torch": "tab:green", "unfused": "tab:orange",
          "llmk 2 kernels": "tab:purple", "compile": "tab:red"}


def is_gemm_row(row) -> bool:
    return row["op"] in OPS


def _cases(rows, op):
    cases = {}
    for r in rows:
        if r["op"] == op:
            cases.setdefault((r["shape"], int(r["tokens"]), int(r["hidden"]), int(r["k"])), {})[r["impl"]] = r
    return cases


def _f(value, digits=0):
    return "-" if value in (None, "") else f"{float(value):.{digits}f}"


def _rate(value):
    """A rate in the table: whole numbers from 10 up, two significant digits below (CPU rows)."""
    if value in (None, ""):
        return "-"
    value = float(value)
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def markdown(rows):
    rows = [r for r in rows if is_gemm_row(r)]
    out = []
    plain = _cases(rows, "gemm")
    if plain:
        peer = next((p for c in plain.values() for p in c if p != "llmk"), "cublas")
        out += ["\n### gemm (llmk.linear against F.linear)\n",
                f"| shape | M | N | K | llmk us | TFLOP/s | % of GEMM peak | weight GB/s | % of copy | "
                f"{peer} us | {peer} TFLOP/s | vs {peer} | llmk max rel err |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for (shape, m, n, k), impls in plain.items():
            o, p = impls.get("llmk"), impls.get(peer)
            if o is None:
                continue
            vs = f"{float(p['time_us']) / float(o['time_us']):.2f}x" if p else "-"
            out.append(f"| {shape} | {m} | {n} | {k} | {float(o['time_us']):.1f} | {_rate(o['tflops'])} | "
                       f"{_f(o['pct_gemm'], 1)}% | {_rate(o['gbs'])} | {_f(o['pct_copy'], 1)} | "
                       f"{_f(p['time_us'], 1) if p else '-'} | {_rate(p['tflops']) if p else '-'} | {vs} | "
                       f"{o['max_rel_err']} |")
    fused = [r for r in rows if r["op"] != "gemm"]
    if fused:
        out += ["\n### Fused GEMM epilogues, rmsnorm_linear (llmk: one kernel) and the training step (gemm_train)\n",
                "| op | shape | M | N | K | llmk us | TFLOP/s | weight GB/s | vs unfused | vs cublas | "
                "vs compile | vs llmk 2 kernels | llmk max rel err |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for op in dict.fromkeys(r["op"] for r in fused):
            for (shape, m, n, k), impls in _cases(rows, op).items():
                o = impls.get("llmk")
                if o is None:
                    continue

                def vs(name, impls=impls, o=o):
                    p = impls.get(name) or (impls.get("torch") if name == "cublas" else None)
                    return f"{float(p['time_us']) / float(o['time_us']):.2f}x" if p else "-"

                out.append(f"| {op} | {shape} | {m} | {n} | {k} | {float(o['time_us']):.1f} | "
                           f"{_rate(o['tflops'])} | {_rate(o['gbs'])} | {vs('unfused')} | {vs('cublas')} | "
                           f"{vs('compile')} | {vs('llmk 2 kernels')} | {o['max_rel_err']} |")
    return out


def plot(rows, path, title=""):
    """TFLOP/s against M per weight shape (llmk and cuBLAS), and below, across the figure, the
    fused forms: each peer's time over llmk's."""
    from .common import figure

    rows = [r for r in rows if is_gemm_row(r)]
    plain = [r for r in rows if r["op"] == "gemm" and not str(r["shape"]).startswith("square")]
    shapes = list(dict.fromkeys(r["shape"] for r in plain))
    fused = [r for r in rows if r["op"] != "gemm"]
    columns = min(4, max(len(shapes), 1))
    lines = -(-len(shapes) // columns)
    fig = figure((3.6 * columns, 2.9 * lines + 3.4 * bool(fused)), title)
    grid = fig.add_gridspec(lines + bool(fused), columns, height_ratios=[1] * lines + [1.3] * bool(fused))
    for i, shape in enumerate(shapes):
        ax = fig.add_subplot(grid[i // columns, i % columns])
        for impl in dict.fromkeys(r["impl"] for r in plain if r["shape"] == shape):
            pts = sorted((int(r["tokens"]), float(r["tflops"])) for r in plain
                         if r["shape"] == shape and r["impl"] == impl)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=impl, color=COLORS.get(impl))
        n, k = next((r["hidden"], r["k"]) for r in plain if r["shape"] == shape)
        ax.set_xscale("log")
        ax.set_title(f"{shape} (N={n}, K={k})", fontsize=8)
        ax.set_xlabel("M", fontsize=8)
        ax.set_ylabel("TFLOP/s", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    if fused:
        ax = fig.add_subplot(grid[lines, :])
        cases = {}
        for r in fused:
            cases.setdefault(f"{r['op']}\n{r['shape']}\nM={r['tokens']}", {})[r["impl"]] = float(r["time_us"])
        peers = [i for i in dict.fromkeys(r["impl"] for r in fused) if i != "llmk"]
        width = 0.8 / max(len(peers), 1)
        for j, peer in enumerate(peers):
            ys = [c[peer] / c["llmk"] if peer in c and "llmk" in c else 0 for c in cases.values()]
            ax.bar([i + j * width for i in range(len(cases))], ys, width=width, label=f"{peer} / llmk",
                   color=COLORS.get(peer))
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))], list(cases), fontsize=5.5)
        ax.set_ylabel("time over llmk's", fontsize=8)
        ax.set_title("fused epilogues, rmsnorm_linear and gemm_train: each peer's time over llmk's "
                     "(above 1: llmk is faster)", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)
