"""Writes docs/benchmarks.md from the newest committed benchmark CSV of each family.

    python3 bench/report.py [--results bench/results/h100] [--out docs/benchmarks.md]

Needs matplotlib only where a family's CSV has no PNG beside it (it then draws one there, once);
torch is not needed. A CSV is a run of the runner (python -m llmk_bench) when its first line is
'# llmk benchmark; commit C; DATE; DEVICE' and it has no variant column; A/B runs, ncu
captures, experiments and reruns of a few chosen rows (names ending _ab, _ncu, or holding
'experiments' or 'gaps') are history and left out. The family of a row comes from its op; a
family's CSV is the newest (latest date, ties broken by when git first saw the file, then by
name) of those with at least half as many of its bf16 rows as the fullest one: a rerun of a
few rows does not stand for the family. The page is a function
of the committed files: running it twice writes the same bytes."""

import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from llmk_bench import views  # noqa: E402
from llmk_bench.views import distributed, e2e, e2e_tp, gemm, generate, loss, overhead, quantized  # noqa: E402
from llmk_bench.views.common import fmt, parse_header, plot_title, read_csv  # noqa: E402

# The page's sections in order: family -> what it covers.
FAMILIES = {
    "norm": "RMSNorm, add + RMSNorm, LayerNorm, gated RMSNorm, forward and backward",
    "activation": "gated activations (SiLU / GELU and mul, SwiGLU) and bias + GELU, forward and backward",
    "softmax": "softmax and log-softmax over rows, forward and backward",
    "loss": "cross-entropy forward + backward, fused linear + cross-entropy",
    "rope": "rotary embedding, from a cos/sin cache or from theta, forward, backward and training",
    "optim": "AdamW step over many tensors",
    "attention forward": "attention forward (causal or not, GQA), TFLOP/s against SDPA's backends",
    "attention backward": "attention backward, TFLOP/s against SDPA's backends",
    "attention train": "attention forward + backward through autograd",
    "attention variants": "attention forward with a sliding window, Gemma 2's logit softcap or gpt-oss's sinks, "
                          "against FlexAttention (compiled) and, for the window, plain causal attention",
    "attention variants train": "the same variants' training step (forward + autograd backward) against "
                                "FlexAttention's and, for the window, plain causal attention's",
    "decode": "attention decode over a KV cache (contiguous, paged, fp8, four queries)",
    "attention paged prefill": "a prefill chunk over a KV cache (paged, shuffled 16-token pages; contiguous) "
                               "against the prefill kernel on dense K/V, the decode kernel and SDPA's backends",
    "gemm": "GEMM (llmk.linear) against cuBLAS, fused epilogues, rmsnorm_linear",
    "quantized": "Weight-only quantized linear (llmk.quantized_linear, int4 / int8 weights) against cuBLAS bf16, tinygemm and int8pack",
    **{f"distributed, {w} GPUs": "tensor-parallel all-reduce + residual add + RMSNorm "
                                  f"(llmk.distributed.all_reduce_add_rmsnorm) against NCCL's all-reduce then "
                                  f"add_rmsnorm_, over {w} GPUs" for w in (2, 4, 8)},
    "e2e": "whole Hugging Face models: prefill and a training step",
    "generation": "whole-model `generate`: time per generated token and to the first one, against transformers' "
                  "eager and static-cache + torch.compile paths",
    "e2e tensor parallel": "a tensor-parallel Llama-3-8B-shaped model (its first layers) over 2 GPUs: a decode step and a "
                           "prefill, transformers' TP forward against llmk.patch",
    "overhead": "what an eager PyTorch user pays per call, and eager fwd+bwd",
    "launch chain": "a chain of 8 small kernels at decode sizes (programmatic dependent launch)",
}
LEFT_OUT = re.compile(r"(_ab|_ncu)$|experiments|gaps")
DTYPE = "bfloat16"  # the runner's default: a family's page shows its bf16 rows


def family_of(op):
    """The page section of a row's op (None: not one of the harness's ops)."""
    if overhead.is_overhead_row({"op": op}):
        return "overhead"
    if e2e.is_e2e_row({"op": op}):
        return "e2e"
    if e2e_tp.is_e2e_tp_row({"op": op}):
        return "e2e tensor parallel"
    if gemm.is_gemm_row({"op": op}):
        return "gemm"
    if quantized.is_quantized_row({"op": op}):
        return "quantized"
    if distributed.is_distributed_row({"op": op}):
        return "distributed"  # before "norm": the op's name holds rmsnorm
    if op in ("cross_entropy", loss.FLCE):
        return "loss"
    if op.startswith("attention_decode"):
        return "decode"
    if op == "attention_paged_prefill":
        return "attention paged prefill"
    if op.startswith(("attention_window", "attention_softcap", "attention_sinks")):
        return "attention variants train" if op.endswith("_train") else "attention variants"
    if op.startswith("attention"):
        return "attention backward" if "backward" in op else "attention train" if "train" in op else \
            "attention forward"
    if op.startswith("chain"):
        return "launch chain"
    if op.startswith(("softmax", "log_softmax")):
        return "softmax"
    if op.startswith("rope"):
        return "rope"
    if op.startswith("adamw"):
        return "optim"
    if "norm" in op:
        return "norm"
    if op.startswith(("silu", "gelu", "swiglu", "bias_gelu")):
        return "activation"
    return None


def family_of_row(row):
    """The page section of a row (the generation suite's rows share their op with older runs'
    e2e decode rows, which no section shows; the distributed rows have one per group size)."""
    if generate.is_generate_row(row):
        return "generation"
    family = family_of(row["op"])
    if family == "distributed":  # one section per group size (each its own run)
        return f"distributed, {row.get('world')} GPUs" if row.get("world") in ("2", "4", "8") else None
    return family


def first_added(results):
    """{file name: unix time of the commit that added it} under `results` (empty without git)."""
    try:
        log = subprocess.run(["git", "log", "--diff-filter=A", "--format=@%ct", "--name-only", "--", results],
                             capture_output=True, text=True, check=True, cwd=ROOT).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    added, when = {}, 0
    for line in log.splitlines():
        if line.startswith("@"):
            when = int(line[1:])
        elif line.strip():
            added.setdefault(os.path.basename(line.strip()), when)  # newest first: keep the first seen
    return added


def runs(results):
    """[(name, (commit, date, device), rows)] of the runner's CSVs under `results`."""
    out = []
    for name in sorted(os.listdir(results)):
        stem, ext = os.path.splitext(name)
        if ext != ".csv" or LEFT_OUT.search(stem):
            continue
        first, rows = read_csv(os.path.join(results, name))
        header = parse_header(first)
        if header is None or not rows or "variant" in rows[0] or "impl" not in rows[0]:
            continue
        out.append((name, header, rows))
    return out


def newest(results):
    """{family: (name, header, the family's bf16 rows)} of the newest run that holds the family's
    sweep (at least half as many of its rows as the fullest run)."""
    added = first_added(os.path.relpath(results, ROOT))
    candidates = {}
    for name, header, rows in runs(results):
        for family in dict.fromkeys(family_of_row(r) for r in rows):
            mine = [r for r in rows if family_of_row(r) == family and r.get("dtype", DTYPE) == DTYPE]
            if family is not None and mine:
                candidates.setdefault(family, []).append(((header[1], added.get(name, 0), name), name, header, mine))
    chosen = {}
    for family in FAMILIES:
        if family in candidates:
            fullest = max(len(c[3]) for c in candidates[family])
            chosen[family] = max(c for c in candidates[family] if 2 * len(c[3]) >= fullest)[1:]
    return chosen


def _info(rows, device):
    info = dict(device=device)
    ceiling = next((r for r in rows if r.get("empty_us") not in (None, "")), None)
    if ceiling:
        info.update(copy_gbs=ceiling["copy_gbs"], empty_us=ceiling["empty_us"])
    return info


def _figure(results, name, family, rows, device, all_rows):
    """The PNG beside the CSV when it shows exactly these rows, else <stem>_<family>.png (drawn once)."""
    stem = os.path.splitext(name)[0]
    beside = os.path.join(results, stem + ".png")
    if len(rows) == len(all_rows) and os.path.exists(beside):
        return beside
    path = os.path.join(results, f"{stem}_{family.replace(' ', '_')}.png")
    if not os.path.exists(path):
        written = views.plot(rows, path, plot_title(device, family))
        print(f"drew {', '.join(os.path.relpath(p, ROOT) for p in written)}")
    return path


def _title(family, header):
    return f"{family}: commit {header[0]}, {header[2]}"


def _anchor(title):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")


def section(results, out_dir, family, name, header, rows, all_rows):
    commit, date, device = header
    rel = os.path.relpath(results, out_dir)
    lines = [f"## {_title(family, header)}", "",
             f"{FAMILIES[family][0].upper()}{FAMILIES[family][1:]}. Run of {date}, CSV "
             f"[`{name}`]({rel}/{name}).", ""]
    info = _info(rows, device)
    if info.get("copy_gbs"):
        lines += [f"Ceilings of that run: copy bandwidth {fmt(info['copy_gbs'])} GB/s, empty kernel "
                  f"{float(info['empty_us']):.2f} us" + (f", bf16 GEMM {fmt(rows[0]['gemm_tflops'])} TFLOP/s"
                                                         if rows[0].get("gemm_tflops") else "") + ".", ""]
    figure = _figure(results, name, family, rows, device, all_rows)
    lines += [f"![{family}]({os.path.relpath(figure, out_dir)})", ""]
    table = views.markdown(rows, info).strip("\n")
    lines += [table.replace("\n### ", "\n#### ").removeprefix("### ").join(["#### ", ""])
              if table.startswith("### ") else table, ""]
    return lines


def page(results, out):
    out_dir = os.path.dirname(os.path.abspath(out))
    chosen = newest(results)
    by_name = {name: rows for name, _, rows in runs(results)}
    rel = os.path.relpath(results, ROOT)
    lines = ["# Benchmarks", "",
             f"Generated by `python3 bench/report.py` from the newest committed CSV of each family under "
             f"`{rel}/`; do not edit by hand. To update a family, commit a new run's CSV "
             "(`make bench`, or `tools/gpu_check.sh` on the GPU machine, named `DATE_COMMIT_name.csv`) and "
             "run the script again.", "",
             "How we measure (DESIGN.md's protocol): CUDA graphs of many calls, input buffers rotated past the "
             "L2, the median of several replays; every row beside the peers timed in the same run (PyTorch eager, "
             "`torch.compile`, SDPA's backends, cuBLAS, Liger-Kernel). `vs X` is X's time over llmk's (above 1: "
             "llmk is faster); `% of copy` is the achieved bandwidth over the run's device-to-device copy; "
             "`x launch` the time over an empty kernel's.", "",
             "The dated history of these numbers, the A/B experiments and the ones not kept: "
             "[history/benchmarks_log.md](history/benchmarks_log.md).", "",
             "| family | commit | date | CSV |", "|---|---|---|---|"]
    lines += [f"| [{f}](#{_anchor(_title(f, h))}) | {h[0]} | {h[1]} | `{n}` |" for f, (n, h, _) in chosen.items()]
    lines.append("")
    for family, (name, header, rows) in chosen.items():
        lines += section(results, out_dir, family, name, header, rows, by_name[name])
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 bench/report.py", description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=os.path.join(ROOT, "bench", "results", "h100"))
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    args = parser.parse_args(argv)
    text = page(os.path.abspath(args.results), args.out)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(os.path.abspath(args.out), ROOT)} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
