"""The overhead suite's tables and plot (no torch: the docs' report script reads CSVs with them).

Rows: ``<name>_host`` (host time per call), ``<name>_fwd_bwd_wall`` and ``<name>_fwd_bwd_kernel``
(eager fwd+bwd through autograd); suites/overhead.py times them. What llmk is built to reach,
checked below the GPU tables: host time per call of every forward op at most HOST_RATIO_LIMIT
times its native counterpart's; rmsnorm's eager fwd+bwd at 8192 x 4096 at most
WALL_OVER_KERNEL_LIMIT times its GPU kernel time and at least RMSNORM_SPEEDUP_AIM times faster
than F.rms_norm's (wall). A CPU run (host time includes the compute) checks none of them.
"""

from .common import verdict

SUFFIXES = ("_host", "_fwd_bwd_wall", "_fwd_bwd_kernel")
HOST_RATIO_LIMIT, WALL_OVER_KERNEL_LIMIT, RMSNORM_SPEEDUP_AIM = 1.2, 1.15, 1.5


def is_overhead_row(row) -> bool:
    return row["op"].endswith(SUFFIXES)


def _by(rows, suffix):
    """{name: {impl: row}} of the rows whose op ends with suffix."""
    out = {}
    for r in rows:
        if r["op"].endswith(suffix):
            out.setdefault(r["op"][: -len(suffix)], {})[r["impl"]] = r
    return out


def markdown(rows):
    """The overhead suite's tables (and on a GPU its limits' verdicts), as markdown lines."""
    out = []
    host = _by(rows, "_host")
    on_cpu = bool(host) and next(iter(host.values()))["llmk"]["queue"] == "-"
    if host:
        out += ["\n### overhead: host time per call " + ("of the CPU path (no GPU: compute included)" if on_cpu else
                                                       "(GPU idle, loops of calls that do not wait on it)") + "\n",
                "| op | shape | llmk host us | torch counterpart | torch host us | llmk / torch | "
                + ("" if on_cpu else f"<= {HOST_RATIO_LIMIT}x | ") + "queue |",
                "|---|---|---:|---|---:|---:|" + ("" if on_cpu else "---|") + "---|"]
        for name, impls in host.items():
            o = impls["llmk"]
            for impl, p in impls.items():
                if impl == "llmk":
                    continue
                ratio = float(o["time_us"]) / float(p["time_us"])
                queue = ", ".join(sorted({o["queue"], p["queue"]}))
                within = "" if on_cpu else f"{verdict(ratio <= HOST_RATIO_LIMIT)} | "
                out.append(f"| {name} | {o['shape']} | {float(o['time_us']):.2f} | {p['counterpart']} | "
                           f"{float(p['time_us']):.2f} | {ratio:.2f} | {within}{queue} |")
        ratio, name, peer = max((float(impls["llmk"]["time_us"]) / float(p["time_us"]), name, p["counterpart"])
                                for name, impls in host.items() for impl, p in impls.items() if impl != "llmk")
        within = "" if on_cpu else f"; limit {HOST_RATIO_LIMIT}x for every forward op: {verdict(ratio <= HOST_RATIO_LIMIT)}"
        out.append(f"\nHost time per call: the largest ratio to a native counterpart is {name}'s {ratio:.2f}x "
                   f"(vs {peer}{within}).")
    wall, kernel = _by(rows, "_fwd_bwd_wall"), _by(rows, "_fwd_bwd_kernel")
    if wall:
        first = next(iter(next(iter(wall.values())).values()))
        out += [f"\n### overhead: eager fwd+bwd through autograd ({first['shape']} {first['dtype']}), per iteration\n",
                "| op | llmk wall us | llmk kernel us | llmk wall / kernel | torch counterpart | torch wall us | "
                "torch kernel us | torch wall / llmk wall |", "|---|---:|---:|---:|---|---:|---:|---:|"]
        for name, impls in wall.items():
            o, p = impls["llmk"], impls["torch"]
            k = kernel.get(name, {})
            ours_k = f"{float(k['llmk']['time_us']):.1f}" if k else "-"
            peer_k = f"{float(k['torch']['time_us']):.1f}" if k else "-"
            ratio = f"{float(o['time_us']) / float(k['llmk']['time_us']):.2f}" if k else "-"
            out.append(f"| {name} | {float(o['time_us']):.1f} | {ours_k} | {ratio} | {p['counterpart']} | "
                       f"{float(p['time_us']):.1f} | {peer_k} | {float(p['time_us']) / float(o['time_us']):.2f}x |")
        if "rmsnorm" in wall and "rmsnorm" in kernel:  # the kernel time exists on a GPU only
            o, p = wall["rmsnorm"]["llmk"], wall["rmsnorm"]["torch"]
            speedup = float(p["time_us"]) / float(o["time_us"])
            over = float(o["time_us"]) / float(kernel["rmsnorm"]["llmk"]["time_us"])
            out.append(f"\nrmsnorm fwd+bwd eager wall: {over:.2f}x its kernel time (limit {WALL_OVER_KERNEL_LIMIT}x: "
                       f"{verdict(over <= WALL_OVER_KERNEL_LIMIT)}); {speedup:.2f}x faster than F.rms_norm "
                       f"(aim {RMSNORM_SPEEDUP_AIM}x: {verdict(speedup >= RMSNORM_SPEEDUP_AIM)}).")
    return out


def plot(rows, path, title=""):
    """The overhead rows' figure: draw()'s two panels side by side."""
    from .common import panels

    fig, axes = panels(1, 2, (10, 5), title)
    draw(axes[0][0], axes[0][1], rows)
    fig.savefig(path, dpi=110)


def draw(ax_host, ax_train, rows):
    """Bars: host us per call (llmk and its torch counterpart), and fwd+bwd wall/kernel us."""
    host = _by(rows, "_host")
    names = list(host)
    for i, impl in enumerate(("llmk", "torch")):
        ax_host.barh([j + 0.4 * i for j in range(len(names))], [float(host[n][impl]["time_us"]) for n in names],
                     height=0.4, label=impl)
    ax_host.set_yticks([j + 0.2 for j in range(len(names))], names, fontsize=6)
    ax_host.set_xscale("log")
    ax_host.invert_yaxis()
    ax_host.set_xlabel("host us per call", fontsize=8)
    ax_host.set_title("overhead: host time per call", fontsize=8)
    ax_host.legend(fontsize=6)
    wall, kernel = _by(rows, "_fwd_bwd_wall"), _by(rows, "_fwd_bwd_kernel")
    names = list(wall)
    bars = [(f"{impl} wall", wall, impl) for impl in ("llmk", "torch")] + \
           [(f"{impl} kernel", kernel, impl) for impl in ("llmk", "torch") if kernel]
    for i, (label, table, impl) in enumerate(bars):
        ax_train.barh([j + i / len(bars) * 0.8 for j in range(len(names))],
                      [float(table[n][impl]["time_us"]) if n in table else 0 for n in names],
                      height=0.8 / len(bars), label=label)
    ax_train.set_yticks([j + 0.4 * (len(bars) - 1) / len(bars) for j in range(len(names))], names, fontsize=6)
    ax_train.invert_yaxis()
    ax_train.set_xlabel("us per fwd+bwd iteration", fontsize=8)
    ax_train.set_title("overhead: eager fwd+bwd", fontsize=8)
    ax_train.legend(fontsize=6)
