"""Timing by the protocol in shared/DESIGN.md: CUDA graphs of many calls (no Python or
launch overhead between them), inputs rotated among enough buffers to defeat the L2,
median over several replays; the machine's ceilings measured in the same run.

Every function takes the device it times ("cuda" or "cpu"). On the CPU (no GPU found) a
call's time is wall time around a loop of calls (perf_counter), on one input set: the
shapes are small and sit in the caches, so CPU rows say how the reference backend
compares with torch's CPU kernels, not what the memory system can do."""

import os
import statistics
import time
from typing import Callable, List, Sequence

import torch

L2_DEFEAT_BYTES = 4 * 64 * 2**20  # rotate through at least 4x a 50-64 MiB L2


def buffer_sets(make: Callable[[], Sequence[torch.Tensor]], bytes_per_call: int, device: str = "cuda",
                max_sets: int = 16) -> List:
    """Enough independent input sets that cycling through them streams from HBM (one set on the CPU)."""
    if device == "cpu":
        return [make()]
    count = max(1, min(max_sets, -(-L2_DEFEAT_BYTES // max(bytes_per_call, 1))))
    return [make() for _ in range(count)]


def time_op(fn: Callable, sets: List, device: str) -> tuple:
    """(median microseconds per call of fn(*set), method): time_cuda or time_cpu."""
    return time_cuda(fn, sets) if device == "cuda" else time_cpu(fn, sets)


def time_each(impls: dict, sets: List, device: str, error_of: Callable, name: str, label: str, failures: List):
    """(impl, fn, time_us, method, max_rel_err) of each impl in order, timed by time_op on `sets`
    with error_of(fn) beside it. An impl that raises is reported (to `failures` as "`name` impl:
    error", and printed after `label`) and skipped; when llmk itself fails, no peer runs."""
    for impl, fn in impls.items():
        try:
            us, method = time_op(fn, sets, device)
            err = error_of(fn)
        except Exception as e:  # noqa: BLE001 - report, go on with the next impl
            failures.append(f"{name} {impl}: {type(e).__name__}: {str(e)[:300]}")
            print(f"{label}  {impl} failed: {failures[-1]}", flush=True)
            if impl == "llmk":
                return
            continue
        yield impl, fn, us, method, err


def time_cuda(fn: Callable, sets: List, min_calls: int = 20, replays: int = 7, errors: List = None) -> tuple:
    """Median microseconds per call of fn(*set), cycling through `sets`. Captures the calls
    in a CUDA graph when it can ("graph"); falls back to back-to-back launches between
    events ("events") for code that cannot be captured, appending why to `errors` if given."""
    calls = max(min_calls, len(sets))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for s in sets:  # warm up every set: compile, autotune, allocate outside the capture
            fn(*s)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                fn(*sets[i % len(sets)])
        run, method = graph.replay, "graph"
        run()
    except Exception as e:  # noqa: BLE001 - not capturable: time plain launches
        torch.cuda.synchronize()
        if errors is not None:
            errors.append(f"{type(e).__name__}: {e}")

        def run():
            for i in range(calls):
                fn(*sets[i % len(sets)])

        method = "events"
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times), method


def time_cpu(fn: Callable, sets: List, min_seconds: float = 0.02, replays: int = 5) -> tuple:
    """Median microseconds per call of fn(*set) on the CPU: loops of enough calls to last
    `min_seconds` (at least one), timed with perf_counter after one warm-up call per set."""
    for s in sets:
        fn(*s)
    t0 = time.perf_counter()
    fn(*sets[0])
    calls = max(1, min(10000, int(min_seconds / max(time.perf_counter() - t0, 1e-7))))
    times = []
    for _ in range(replays):
        t0 = time.perf_counter()
        for i in range(calls):
            fn(*sets[i % len(sets)])
        times.append((time.perf_counter() - t0) * 1e6 / calls)
    return statistics.median(times), "cpu"


def with_env(variable: str, value: str, fn: Callable) -> Callable:
    """fn with the environment variable set to value around each call (the previous value
    restored after): the LLMK_*_PATH switches, which the C++ reads per call."""
    def run(*args):
        previous = os.environ.get(variable)
        os.environ[variable] = value
        try:
            return fn(*args)
        finally:
            if previous is None:
                del os.environ[variable]
            else:
                os.environ[variable] = previous
    return run


def sync(device: str) -> None:
    """Waits for the GPU's queued work (nothing on the CPU)."""
    if device == "cuda":
        torch.cuda.synchronize()


def median_seconds(fn: Callable, device: str, repeats: int = 20) -> float:
    """Median seconds of single calls of fn after one warm-up: CUDA events on the GPU, perf_counter on the CPU."""
    fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth_gbs(device: str = "cuda") -> float:
    """Device-to-device copy of 2 GiB (bytes read plus written per second): the best of a
    cudaMemcpy (Tensor.copy_) and an elementwise copy kernel, each the median of 20. On the
    CPU the same of 128 MiB (past the caches)."""
    n = 2**30 if device == "cuda" else 2**26
    src = torch.randn(n, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    best = 0.0
    for copy in (lambda: dst.copy_(src), lambda: torch.mul(src, 1, out=dst)):
        best = max(best, 2 * src.numel() * src.element_size() / median_seconds(copy, device) / 1e9)
    return best


def empty_launch_us(device: str = "cuda") -> float:
    """Per-call time of a kernel that does nothing, timed like every other row. On the CPU:
    an op on one element (torch.neg into a preallocated output), the dispatcher's floor."""
    if device == "cuda":
        us, _ = time_cuda(lambda: torch.cuda._sleep(0), [()], min_calls=50)
    else:
        one = torch.ones(1)
        us, _ = time_cpu(lambda: torch.neg(one, out=one), [()])
    return us


def gemm_tflops(device: str = "cuda") -> float:
    """The tensor-core ceiling: a bf16 cuBLAS GEMM of 8192^3 (torch.matmul), the median of
    20 (on the CPU: a bf16 GEMM of 1024^3)."""
    n = 8192 if device == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    us, _ = time_op(torch.matmul, [(a, b)], device)
    return 2 * n**3 / us / 1e6
