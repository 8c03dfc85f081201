"""The generation suite's table and plot (no torch: the docs' report script reads CSVs with them).

Rows: op ``e2e_decode`` with a ``batch`` column, one per (context, batch, impl); suites/generate.py
times them. AIMS (issue 54), checked below each GPU table: the decode step at least 1.3x
hf_static_compile and 3x hf_eager at every cell; the fp8 cache's step at context 32768 at least
1.15x the bf16 cache's; the time to first token at 32768 at least 1.3x hf_eager's.
"""

from .common import ms, time_ratio, times, verdict


OP = "e2e_decode"
IMPLS = ("hf_eager", "hf_static_compile", "llmk", "llmk_fp8", "llmk_int4")
COLORS = dict(hf_eager="tab:orange", hf_static_compile="tab:red", llmk="tab:blue", llmk_fp8="tab:cyan",
              llmk_int4="tab:green")
AIMS = dict(vs_compile=1.3, vs_eager=3.0, fp8=(32768, 1.15), ttft=(32768, 1.3))


def is_generate_row(row) -> bool:
    """A row of this suite (the older e2e suite's decode phase had the same op and no batch column)."""
    return row["op"] == OP and row.get("batch") not in (None, "")


def _cells(rows):
    cells = {}
    for r in rows:
        cells.setdefault((int(r["tokens"]), int(r["batch"])), {})[r["impl"]] = r
    return cells


def _model(row) -> str:
    return row.get("model") or "llama"


def markdown(rows):
    """A table per model family of the rows (--gen-family), Llama's first."""
    rows = [r for r in rows if is_generate_row(r)]
    out = []
    for model in sorted(dict.fromkeys(map(_model, rows)), key=lambda m: m != "llama"):
        out += _markdown_model([r for r in rows if _model(r) == model], model)
    return out


def _markdown_model(rows, model):
    on_cpu = not any(r.get("peak_mem_gb") not in (None, "") for r in rows)
    cells = _cells(rows)
    impls = [i for i in IMPLS if any(i in c for c in cells.values())]
    shapes = "a Llama-3-8B-shaped model" if model == "llama" else f"a {model} model (the e2e suite's checkpoint shapes)"
    out = [f"\n### e2e generation: `generate` on {shapes}, {rows[0]['layers']} layers, greedy; "
           "ms per generated token after the first (decode step; `graph replay`: llmk's captured step alone, "
           "the GPU's part of it) and time to first token"
           + (" (CPU: a tiny config, the code path only)" if on_cpu else "") + "\n",
           "| context | batch | " + " | ".join(f"{i} step ms" for i in impls) + " | llmk graph replay ms | llmk vs static+compile | "
           "llmk vs eager | fp8 vs llmk | int4 vs llmk | " + " | ".join(f"{i} TTFT ms" for i in impls) + " | llmk TTFT vs eager | "
           "llmk tok/s | max rel err / tokens agreeing " + " / ".join(i for i in impls if i != "hf_eager") + " |",
           "|---:|---:|" + "---:|" * len(impls) + "---:|---:|---:|---:|---:|" + "---:|" * len(impls) + "---:|---:|---|"]
    notes = {}
    for (ctx, batch), c in sorted(cells.items()):
        o = c.get("llmk")
        errors = " / ".join(f"{c[i].get('max_rel_err') or '-'} ({c[i].get('agree') or '-'})" if i in c else "-"
                            for i in impls if i != "hf_eager")
        out.append(f"| {ctx} | {batch} | " + " | ".join(ms(c.get(i)) for i in impls) +
                   f" | {ms(o, 'graph_us')} | {times(time_ratio(c.get('hf_static_compile'), o))} | {times(time_ratio(c.get('hf_eager'), o))} | "
                   f"{times(time_ratio(o, c.get('llmk_fp8')))} | {times(time_ratio(o, c.get('llmk_int4')))} | " + " | ".join(ms(c.get(i), 'ttft_us') for i in impls) +
                   f" | {times(time_ratio(c.get('hf_eager'), o, 'ttft_us'))} | {(o.get('tokens_per_s') or '-') if o else '-'} "
                   f"| {errors} |")
        for i in impls:
            if i in c and c[i].get("note"):
                notes.setdefault(c[i]["note"], []).append(f"{ctx} x {batch} {i}")
    if not on_cpu:
        out += _aims(cells)
    if notes:
        out += ["", "Notes:"] + [f"- {', '.join(where)}: {note}" for note, where in notes.items()]
    return out


def _aims(cells):
    lines = ["", "Aims:"]
    for (ctx, batch), c in sorted(cells.items()):
        o = c.get("llmk")
        if not o:
            continue
        vc, ve = time_ratio(c.get("hf_static_compile"), o), time_ratio(c.get("hf_eager"), o)
        text = (f"- {ctx} x {batch}: step {times(vc)} hf_static_compile (>= {AIMS['vs_compile']}x: "
                f"{verdict(vc and vc >= AIMS['vs_compile']) if vc else 'not measured'}), {times(ve)} hf_eager "
                f"(>= {AIMS['vs_eager']}x: {verdict(ve and ve >= AIMS['vs_eager'])})")
        if ctx == AIMS["fp8"][0] and "llmk_fp8" in c:
            f8 = time_ratio(o, c["llmk_fp8"])
            text += f"; fp8 cache {times(f8)} the bf16 cache (>= {AIMS['fp8'][1]}x: {verdict(f8 and f8 >= AIMS['fp8'][1])})"
        if ctx == AIMS["ttft"][0]:
            t = time_ratio(c.get("hf_eager"), o, "ttft_us")
            text += f"; TTFT {times(t)} hf_eager (>= {AIMS['ttft'][1]}x: {verdict(t and t >= AIMS['ttft'][1])})"
        lines.append(text + ".")
    return lines


def plot(rows, path, title=""):
    """Decode-step speedup over hf_eager of each impl, a bar group per (context, batch)."""
    from .common import panels

    rows = [r for r in rows if is_generate_row(r)]
    first = min(map(_model, rows), key=lambda m: m != "llama") if rows else "llama"  # one family: Llama's first
    cells = _cells([r for r in rows if _model(r) == first])
    impls = [i for i in IMPLS if any(i in c for c in cells.values())]
    fig, axes = panels(1, 1, (9, 3.4), title)
    ax = axes[0, 0]
    width = 0.8 / max(len(impls), 1)
    keys = sorted(cells)
    for k, impl in enumerate(impls):
        ys = [time_ratio(cells[key].get("hf_eager"), cells[key].get(impl)) or 0 for key in keys]
        ax.bar([j + k * width for j in range(len(keys))], ys, width=width, label=impl, color=COLORS[impl])
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))], [f"ctx {t} x B{b}" for t, b in keys], fontsize=8)
    ax.set_ylabel("decode step speedup over hf_eager", fontsize=8)
    ax.set_title(f"generate: time per generated token ({first})", fontsize=9)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)
