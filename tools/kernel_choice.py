"""The kernels llmk launches for each call of a sweep, by name (torch.profiler), one line a
call: run it under two builds and diff the outputs to show that a change kept the dispatch
(every call takes the same kernel and launch shape), where a timed A/B would only sample it.

    PYTHONPATH=python python3 tools/kernel_choice.py norm > choice.txt
"""
import bisect
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import llmk

# Row lengths from 512 to 64k columns: every model's hidden size, and past the longest row
# each register kernel holds.
COLUMNS = (512, 1024, 2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192, 12288, 14336, 16384, 24576, 32768,
           40960, 65536)
ROWS = (1, 300, 4096)  # decode, few rows, many rows


def norm_calls():
    """Groups of calls over the same tensors (a group's tensors are freed before the next)."""
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for weight_dtype in sorted({dtype, torch.float32}, key=str):
            for rows in ROWS:
                for d in COLUMNS:
                    if rows * d > 1 << 26:
                        continue
                    x = torch.randn(rows, d, device="cuda", dtype=dtype)
                    g = torch.randn(rows, d, device="cuda", dtype=dtype)
                    w = torch.randn(d, device="cuda", dtype=weight_dtype)
                    b = torch.randn(d, device="cuda", dtype=weight_dtype)
                    tag = f"{str(dtype)[6:]} w={str(weight_dtype)[6:]} {rows}x{d}"
                    yield [
                        (f"rmsnorm {tag}", lambda: llmk.rmsnorm(x, w)),
                        (f"add_rmsnorm {tag}", lambda: torch.ops.llmk.add_rmsnorm(x, g, w)),
                        (f"rmsnorm_swiglu {tag}", lambda: torch.ops.llmk.rmsnorm_swiglu(x, g, w)),
                        (f"layernorm {tag}", lambda: llmk.layernorm(x, w, b)),
                        (f"layernorm_noaffine {tag}", lambda: llmk.layernorm(x)),
                        (f"rmsnorm_backward {tag}", lambda: torch.ops.llmk.rmsnorm_backward(g, x, w)),
                        (f"rmsnorm_swiglu_backward {tag}",
                         lambda: torch.ops.llmk.rmsnorm_swiglu_backward(g, x, g, w)),
                    ]


SWEEPS = {"norm": norm_calls}


def choices(calls, trace="/tmp/kernel_choice_trace.json"):
    """(label, kernels) per call: every call runs once unprofiled (one-time queries and
    allowances), then once inside its own record_function range of one profile; a kernel
    belongs to the range that holds its launch (matched by the launch's correlation id)."""
    calls = list(calls)
    errors = {}
    for label, fn in calls:
        try:
            fn()
        except Exception as error:  # noqa: BLE001 - a rejected call is part of the record
            errors[label] = "error " + str(error).splitlines()[0]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for label, fn in calls:
            if label not in errors:
                with record_function(label):
                    fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(trace)
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    ranges = sorted(((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                     if e.get("cat") == "user_annotation" and e["name"] in dict(calls)), key=lambda r: r[0])
    starts = [r[0] for r in ranges]
    label_of = {}  # correlation id -> label
    for e in events:
        if e.get("cat") == "cuda_runtime" and "Launch" in e.get("name", ""):
            i = bisect.bisect_right(starts, e["ts"]) - 1
            if i >= 0 and e["ts"] <= ranges[i][1]:
                label_of[e["args"]["correlation"]] = ranges[i][2]
    kernels = {}
    for e in sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"]):
        label = label_of.get(e["args"].get("correlation"))
        if label is not None:
            kernels.setdefault(label, []).append(f"{e['name']} grid={e['args'].get('grid')} "
                                                 f"block={e['args'].get('block')}")
    for label, _ in calls:
        yield label, errors.get(label) or " | ".join(kernels.get(label, ["(no kernel)"]))


def main(argv):
    for sweep in argv[1:] or list(SWEEPS):
        for group in SWEEPS[sweep]():
            for label, kernels in choices(group):
                print(f"{label}: {kernels}", flush=True)


if __name__ == "__main__":
    main(sys.argv)
