"""The tensor-parallel end-to-end suite's table and plot (no torch: the docs' report script reads
CSVs with them).

Rows: op ``e2e_tp``, one per (world, phase, tokens, batch, impl), with ``world``, ``phase``
(decode: tokens = context, time_us = the decode step; prefill: tokens = prompt length, batch 1),
``layers`` and ``tp_fused`` (decoder layers whose all-reduces llmk.patch fused); suites/e2e_tp.py
times them. AIMS (checked below each GPU table at world 2): llmk_decode's decode step at least
1.15x hf_tp's at every decode cell, llmk's prefill of 1 x 8192 at least 1.1x hf_tp's.
"""

from .common import ms, time_ratio, times, verdict

OP = "e2e_tp"
IMPLS = ("hf_tp", "llmk", "llmk_decode")
PEERS = IMPLS[1:]  # each against hf_tp
COLORS = dict(hf_tp="tab:orange", llmk="tab:blue", llmk_decode="tab:cyan")
PHASES = ("decode", "prefill")
AIMS = dict(world=2, decode=("llmk_decode", 1.15), prefill=("llmk", 8192, 1.1))


def is_e2e_tp_row(row) -> bool:
    return row["op"] == OP


def _cells(rows):
    """{(world, phase): {(tokens, batch): {impl: row}}} in the rows' order."""
    out = {}
    for r in rows:
        if is_e2e_tp_row(r):
            key = (int(r["world"]), r["phase"])
            out.setdefault(key, {}).setdefault((int(r["tokens"]), int(r["batch"])), {})[r["impl"]] = r
    return out


def _on_cpu(rows) -> bool:
    return not any(r.get("peak_mem_gb") not in (None, "") for r in rows)


def _error(row, phase) -> str:
    """A row's max_rel_err, and on decode rows its tokens agreeing with hf_tp's."""
    if row is None:
        return "-"
    return (row.get("max_rel_err") or "-") + (f" ({row.get('agree') or '-'})" if phase == "decode" else "")


def _table(phase, cells):
    """The markdown lines of one (world, phase) table: a column per impl's time, per llmk impl's
    speedup over hf_tp and error, and hf_tp's time to first token on decode rows."""
    impls = [i for i in IMPLS if any(i in c for c in cells.values())]
    peers = [i for i in PEERS if i in impls]
    decode = phase == "decode"
    head = (["context" if decode else "tokens", "batch"] + [f"{i} ms" for i in impls]
            + [f"{i} vs hf_tp" for i in peers] + (["hf_tp TTFT ms"] if decode else [])
            + [f"{i} max rel err" + (" (tokens agreeing)" if decode else "") for i in peers])
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * (len(head) - len(peers)) + "---|" * len(peers)]
    for (tokens, batch), c in cells.items():
        base = c.get("hf_tp")
        cols = ([str(tokens), str(batch)] + [ms(c.get(i)) for i in impls]
                + [times(time_ratio(base, c.get(i))) for i in peers] + ([ms(base, "ttft_us")] if decode else [])
                + [_error(c.get(i), phase) for i in peers])
        lines.append("| " + " | ".join(cols) + " |")
    return lines


def markdown(rows):
    """A table per (world, phase): each impl's time, llmk's speedups over hf_tp, the errors; the
    aims below the GPU tables; markdown lines."""
    rows = [r for r in rows if is_e2e_tp_row(r)]
    if not rows:
        return []
    out, cpu = [], _on_cpu(rows)
    captions = {"decode": "`generate`, greedy: ms per generated token after the first (decode step)",
                "prefill": "one forward of batch 1 without a cache, logits of the last token"}
    for (world, phase), cells in _cells(rows).items():
        fused = next((r["tp_fused"] for c in cells.values() for r in c.values() if r.get("tp_fused") not in (None, "")),
                     "-")
        out += [f"\n### e2e tensor-parallel {phase}, world {world}: a Llama-3-8B-shaped model, {rows[0]['layers']} "
                f"layers, loaded with tp_plan=\"auto\"; {captions[phase]}; llmk.patch fused the all-reduces of "
                f"{fused} layers" + (" (CPU: gloo, a tiny config, the code path only)" if cpu else "") + "\n"]
        out += _table(phase, cells)
        if not cpu and world == AIMS["world"]:
            out += _aims(phase, cells)
        notes = {}
        for (tokens, batch), c in cells.items():
            for i, r in c.items():
                if r.get("note"):
                    notes.setdefault(r["note"], []).append(f"{tokens} x {batch} {i}")
        if notes:
            out += ["", "Notes:"] + [f"- {', '.join(where)}: {note}" for note, where in notes.items()]
    return out


def _aims(phase, cells):
    lines = ["", "Aims:"]
    if phase == "decode":
        impl, aim = AIMS["decode"]
        for (ctx, batch), c in cells.items():
            r = time_ratio(c.get("hf_tp"), c.get(impl))
            lines.append(f"- {ctx} x {batch}: {impl}'s step {times(r)} hf_tp's (>= {aim}x: "
                         f"{verdict(r and r >= aim) if r else 'not measured'}).")
    else:
        impl, size, aim = AIMS["prefill"]
        c = cells.get((size, 1), {})
        r = time_ratio(c.get("hf_tp"), c.get(impl))
        lines.append(f"- 1 x {size}: {impl} {times(r)} hf_tp (>= {aim}x: "
                     f"{verdict(r and r >= aim) if r else 'not measured'}).")
    return lines


def plot(rows, path, title=""):
    """Per world size, the speedup of each llmk impl over hf_tp: a bar group per decode cell and
    prefill length."""
    from .common import panels

    by_world = {}
    for (world, phase), cells in _cells(rows).items():
        for (tokens, batch), c in cells.items():
            label = f"decode ctx {tokens} x B{batch}" if phase == "decode" else f"prefill 1 x {tokens}"
            by_world.setdefault(world, []).append((label, c))
    fig, axes = panels(len(by_world), 1, (9, 3.4 * max(len(by_world), 1)), title)
    for ax, (world, groups) in zip(axes[:, 0], by_world.items()):
        peers = [i for i in PEERS if any(i in c for _, c in groups)]
        width = 0.8 / max(len(peers), 1)
        for k, impl in enumerate(peers):
            ys = [time_ratio(c.get("hf_tp"), c.get(impl)) or 0 for _, c in groups]
            ax.bar([j + k * width for j in range(len(groups))], ys, width=width, label=impl, color=COLORS[impl])
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], [g[0] for g in groups], fontsize=7,
                      rotation=15)
        ax.set_ylabel("speedup over hf_tp", fontsize=8)
        layers = groups[0][1][next(iter(groups[0][1]))]["layers"]
        ax.set_title(f"{OP}: tensor-parallel Llama-3-8B shapes, {layers} layers, world {world} (decode step; "
                     "prefill forward)", fontsize=9)
        ax.tick_params(labelsize=7)
        if peers:
            ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)
