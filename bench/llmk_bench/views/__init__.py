"""Tables and plots of benchmark rows, without torch: the runner prints and writes them after a
run, and bench/report.py builds docs/benchmarks.md from committed CSVs with them."""

import os

from . import distributed, e2e, e2e_tp, gemm, generate, loss, overhead, quantized, sweep


def markdown(rows, info) -> str:
    """Every suite's tables of `rows` (info: the run's ceilings), as one markdown text."""
    out = (sweep.markdown(rows, info) + gemm.markdown(rows) + quantized.markdown(rows) + distributed.markdown(rows)
           + loss.markdown_fused_linear_cross_entropy(rows) + overhead.markdown(rows) + e2e.markdown(rows)
           + generate.markdown(rows) + e2e_tp.markdown(rows))
    return "\n".join(out) + "\n"


def plot(rows, path, title) -> list:
    """The figures of `rows`: the sweeps' (with the overhead panels) at `path`, the gemm, quantized,
    distributed, e2e, generation and e2e_tp suites' beside it as <name>_gemm.png, <name>_quantized.png,
    <name>_distributed.png, <name>_e2e.png, <name>_generate.png and <name>_e2e_tp.png (the first of
    them at `path` when no sweep rows are there).
    Returns the paths written."""
    root, ext = os.path.splitext(path)
    main = [r for r in rows if sweep.is_sweep_row(r) or overhead.is_overhead_row(r)]
    written = []
    for suite, is_row, suffix in ((gemm, gemm.is_gemm_row, "_gemm"),
                                  (quantized, quantized.is_quantized_row, "_quantized"),
                                  (distributed, distributed.is_distributed_row, "_distributed"),
                                  (e2e, e2e.is_e2e_row, "_e2e"),
                                  (generate, generate.is_generate_row, "_generate"),
                                  (e2e_tp, e2e_tp.is_e2e_tp_row, "_e2e_tp")):
        mine = [r for r in rows if is_row(r)]
        if mine:
            written.append(path if not (main or written) else f"{root}{suffix}{ext or '.png'}")
            suite.plot(mine, written[-1], title)
    if main:
        sweep.plot(main, path, title)
        written.insert(0, path)
    return written
