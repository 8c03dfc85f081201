"""The e2e suite's table and plot (no torch: the docs' report script reads CSVs with them).

Rows: op ``e2e_<phase>``, one per model, size and implementation (suites/e2e.py times them).
AIMS: the speedups llmk is built to reach at one size per phase, checked below each GPU table:
prefill at 32768 tokens at least 1.3x eager and 1.1x torch.compile; the training step at
least 1.2x eager and 1.0x Liger-Kernel with a lower peak memory than both. Generation (op
e2e_decode with a batch column) is views/generate.py's.
"""

import json

from .common import as_float, ms, time_ratio, times, verdict

PHASES = ("prefill", "train")
IMPLS = ("eager", "compile", "liger", "llmk", "llmk_linear", "llmk_compile")
COLORS = dict(eager="tab:orange", compile="tab:red", liger="tab:green", llmk="tab:blue", llmk_linear="tab:cyan",
              llmk_compile="tab:purple")
# phase -> (tokens, speedup over eager, speedup over the second peer: compile for prefill, Liger for train)
AIMS = {"prefill": (32768, 1.3, 1.1), "train": (2048, 1.2, 1.0)}


def is_e2e_row(row) -> bool:
    """A row of this suite: its phases' ops (older runs' e2e_decode rows, a phase since moved to
    the generation suite, are not drawn)."""
    return row["op"] in {f"e2e_{p}" for p in PHASES}


def _left(rows):
    """{part: reason} that llmk.patch left, from the llmk rows' reports."""
    for r in rows:
        if r.get("llmk_left"):
            return json.loads(r["llmk_left"])
    return {}


def markdown(rows):
    """One table per phase, the aims below each (GPU runs); markdown lines."""
    rows = [r for r in rows if is_e2e_row(r)]
    if not rows:
        return []
    out = []
    left = _left(rows)
    first = rows[0]
    on_cpu = not any(r.get("peak_mem_gb") not in (None, "") for r in rows)
    captions = {
        "prefill": "one forward of batch 1, no cache, logits of the last token (`logits_to_keep=1`)",
        "train": "forward, the model's cross-entropy loss, backward and torch.optim.AdamW step, bf16",
    }
    for phase in PHASES:
        cases = {}
        for r in rows:
            if r["op"] == f"e2e_{phase}":
                cases.setdefault((r["model"], int(r["tokens"])), {})[r["impl"]] = r
        if not cases:
            continue
        impls = [i for i in IMPLS if any(i in c for c in cases.values())]
        peers = [i for i in impls if i != "eager"]
        out += [f"\n### e2e {phase}: {captions[phase]}; {first['layers']} layers"
                + (" (CPU: tiny configs, eager calls, no peak memory: the code path only)" if on_cpu else "") + "\n",
                "| model | tokens | " + " | ".join(f"{i} ms" for i in impls) + " | llmk tok/s | " +
                ("" if on_cpu else "peak GB " + " / ".join(impls) + " | ") +
                "llmk vs eager | llmk vs compile | llmk_compile vs compile | max rel err " + " / ".join(peers) + " |",
                "|---|---:|" + "---:|" * len(impls) + "---:|" + ("" if on_cpu else "---|") + "---:|---:|---:|---|"]
        notes = {}  # note -> the rows that have it
        for (family, tokens), c in cases.items():
            o = c.get("llmk")
            peaks = " / ".join(str(c[i].get("peak_mem_gb") or "-") if i in c else "-" for i in impls)
            errors = " / ".join((c[i].get("max_rel_err") or "-") if i in c else "-" for i in peers)
            out.append(f"| {family} | {tokens} | " + " | ".join(ms(c.get(i)) for i in impls) +
                       f" | {(o.get('tokens_per_s') or '-') if o else '-'} | " + ("" if on_cpu else f"{peaks} | ") +
                       f"{times(time_ratio(c.get('eager'), o))} | {times(time_ratio(c.get('compile'), o))} | "
                       f"{times(time_ratio(c.get('compile'), c.get('llmk_compile')))} | {errors} |")
            for i in impls:
                if i in c and c[i].get("note"):
                    notes.setdefault(c[i]["note"], []).append(f"{family} {tokens} {i}")
                if i in c and c[i].get("logits") == "all":
                    notes.setdefault("logits of every token (the model takes no logits_to_keep)", []).append(
                        f"{family} {tokens} {i}")
        out += [] if on_cpu else _aims(phase, cases, left)
        if notes:
            out += ["", "Notes:"] + [f"- {', '.join(where)}: {note}" for note, where in notes.items()]
    if left:
        out.append("\nLeft by llmk.patch (its report): " + "; ".join(f"{k}: {v}" for k, v in left.items()) + ".")
    return out


def _aims(phase, cases, left):
    aim = AIMS[phase]
    size = aim[0]
    lines = []
    for (family, tokens), c in cases.items():
        if tokens != size or "llmk" not in c:
            continue
        o = c["llmk"]
        vs_eager = time_ratio(c.get("eager"), o)
        if phase == "prefill":
            best = max(filter(None, [time_ratio(c.get("compile"), o), time_ratio(c.get("compile"), c.get("llmk_compile"))]),
                       default=None)
            text = (f"{times(vs_eager)} eager (>= {aim[1]}x: {verdict(vs_eager and vs_eager >= aim[1])}), "
                    f"best of llmk / llmk_compile {times(best)} compile (>= {aim[2]}x: "
                    f"{verdict(best and best >= aim[2]) if best else 'not measured'})")
        else:
            vs_liger = time_ratio(c.get("liger"), o)
            peaks = {i: as_float(c[i].get("peak_mem_gb")) for i in ("eager", "liger", "llmk") if i in c}
            lower = peaks.get("llmk") is not None and all(
                peaks.get(i) is not None and peaks["llmk"] < peaks[i] for i in ("eager", "liger"))
            text = (f"{times(vs_eager)} eager (>= {aim[1]}x: {verdict(vs_eager and vs_eager >= aim[1])}), "
                    f"{times(vs_liger)} Liger (>= {aim[2]}x: "
                    f"{verdict(vs_liger and vs_liger >= aim[2]) if vs_liger else 'not measured'}), peak "
                    + f"{peaks.get('llmk')} GB vs eager {peaks.get('eager', '-')} / Liger {peaks.get('liger', '-')}"
                    f" (lower than both: {verdict(lower)})")
            if "cross_entropy" in left:
                text += f"; llmk.patch left cross_entropy: {left['cross_entropy']}"
        if "linear" in left:
            text += f"; left linear (the GEMMs): {left['linear']}"
        lines.append(f"- {family} {phase} {tokens}: llmk {text}.")
    if lines:
        lines.insert(0, f"\nAims ({phase} at {size}):")
    return lines


def plot(rows, path, title=""):
    """Speedup over the eager model of each impl, one panel per phase, a bar group per (model, size)."""
    from .common import panels

    rows = [r for r in rows if is_e2e_row(r)]
    phases = [p for p in PHASES if any(r["op"] == f"e2e_{p}" for r in rows)]
    fig, axes = panels(len(phases), 1, (10, 3.2 * len(phases)), title)
    for ax, phase in zip(axes[:, 0], phases):
        cases = {}
        for r in rows:
            if r["op"] == f"e2e_{phase}":
                cases.setdefault(f"{r['model']} {r['tokens']}", {})[r["impl"]] = r
        impls = [i for i in IMPLS if any(i in c for c in cases.values())]
        width = 0.8 / max(len(impls), 1)
        for k, impl in enumerate(impls):
            ys = [time_ratio(c.get("eager"), c.get(impl)) or 0 for c in cases.values()]
            ax.bar([j + k * width for j in range(len(cases))], ys, width=width, label=impl, color=COLORS[impl])
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], list(cases), fontsize=7, rotation=20)
        ax.set_ylabel("speedup over eager", fontsize=8)
        ax.set_title(f"e2e {phase}", fontsize=9)
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)
