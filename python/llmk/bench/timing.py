"""Timing by the protocol in shared/DESIGN.md: CUDA graphs of many calls (no Python or
launch overhead between them), inputs rotated among enough buffers to defeat the L2,
median over several replays; the machine's ceilings measured in the same run."""

import statistics
import time
from typing import Callable, List, Sequence

import torch

L2_DEFEAT_BYTES = 4 * 64 * 2**20  # rotate through at least 4x a 50-64 MiB L2


def buffer_sets(make: Callable[[], Sequence[torch.Tensor]], bytes_per_call: int, max_sets: int = 16) -> List:
    """Enough independent input sets that cycling through them streams from HBM."""
    count = max(1, min(max_sets, -(-L2_DEFEAT_BYTES // max(bytes_per_call, 1))))
    return [make() for _ in range(count)]


def time_cuda(fn: Callable, sets: List, min_calls: int = 20, replays: int = 7) -> tuple:
    """Median microseconds per call of fn(*set), cycling through `sets`. Captures the calls
    in a CUDA graph when it can ("graph"); falls back to back-to-back launches between
    events ("events") for code that cannot be captured."""
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
    except Exception:  # noqa: BLE001 - not capturable: time plain launches
        torch.cuda.synchronize()

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


def time_cpu(fn: Callable, args: Sequence, repeats: int = 5) -> float:
    fn(*args)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 2 GiB (bytes read plus written per second): the best of a
    cudaMemcpy (Tensor.copy_) and an elementwise copy kernel, each the median of 20."""
    n = 2**30
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    best = 0.0
    for copy in (lambda: dst.copy_(src), lambda: torch.mul(src, 1, out=dst)):
        copy()
        torch.cuda.synchronize()
        times = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            copy()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        best = max(best, 2 * src.numel() * src.element_size() / statistics.median(times) / 1e9)
    return best


def empty_launch_us() -> float:
    """Per-call time of a kernel that does nothing, timed like every other row."""
    us, _ = time_cuda(lambda: torch.cuda._sleep(0), [()], min_calls=50)
    return us


def gemm_tflops() -> float:
    """The tensor-core ceiling: a bf16 cuBLAS GEMM of 8192^3 (torch.matmul), the median of 20."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    us, _ = time_cuda(torch.matmul, [(a, b)], min_calls=20)
    return 2 * n**3 / us / 1e6
