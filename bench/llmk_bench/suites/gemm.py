"""Benchmark cases of the gemm family (`--op gemm`, in --all), bf16, kernel times by the harness's
protocol (timing.time_cuda: CUDA graphs of 20 calls, median of 7 replays; input sets rotated
so that at least 256 MiB stream per cycle: a weight that fits the L2 is not re-read from it
at small M).

- ``gemm``: ``llmk.linear(x, w)`` (impl ``llmk``) against ``F.linear`` (impl ``cublas``) over
  the projections of Llama-3-8B (qkv 6144x4096, o 4096x4096, gate/up 28672x4096, down
  4096x14336) and Qwen2.5-7B (qkv 4608x3584, gate/up 37888x3584, down 3584x18944), (N, K) =
  weight.shape, at M = 1, 16, 64, 256, 2048, 8192, 16384 rows; and the squares M = N = K =
  4096, 8192.
- Fused epilogues at M = 2048, 8192, impl ``llmk`` (one kernel) against ``unfused`` (F.linear,
  then the op after it: a torch add for bias and residual, ``llmk.swiglu`` on the two halves of
  the gate/up output, ``llmk.bias_gelu``) and ``cublas`` where cuBLAS fuses the same epilogue
  (``F.linear`` with bias, ``torch.addmm`` of the residual, ``torch._addmm_activation``'s
  cuBLASLt bias+GELU(tanh) epilogue): ``gemm_bias`` (Qwen2.5-7B qkv, which has a bias),
  ``gemm_residual`` (Llama-3-8B o and down), ``gemm_silu_mul`` (Llama-3-8B gate/up: N = 28672
  weight rows, 14336 outputs), ``gemm_gelu`` (a 4x GELU MLP's up projection 16384x4096,
  tanh GELU with bias).
  ``gemm_silu_mul`` also against ``compile`` (``torch.compile`` of F.linear, then silu(gate) *
  up: Inductor's own fusion of the activation; GPU only).
- ``rmsnorm_linear`` at M = 1, 16, 64 over Llama-3-8B qkv and gate/up: ``llmk`` (one kernel)
  against ``unfused`` (``llmk.rmsnorm`` then ``F.linear``) and ``llmk 2 kernels``
  (``llmk.rmsnorm`` then ``llmk.linear``).
- ``gemm_train`` (part ``train``) at M = 2048, 8192 over Llama-3-8B qkv, up (14336x4096) and
  down: one training step of the projection, the forward and both gradients (dx, dweight)
  through autograd, ``llmk.linear`` against ``F.linear`` (cuBLAS); 3 x 2MNK FLOPs, dx checked.

Columns: the harness's (tokens = M, hidden = N), plus ``k`` and ``shape``; ``tflops`` and
``pct_gemm`` (of the same run's cuBLAS 8192^3 bf16 rate); for M <= 64 ``gbs`` is the weight
bytes over the time and ``pct_copy`` that over the measured copy bandwidth (empty above 64
rows, where the weight is not the bound). ``max_rel_err``: max|out - ref| / max|ref| on up to
64 rows x 1024 columns against a float64 reference.

Trimming (a short GPU run): ``--gemm-shapes`` (names of any part's shapes, or the groups llama,
qwen, square; every part keeps only the named shapes),
``--gemm-m`` (the M list of the plain sweep), ``--gemm-parts`` (plain fused rmsnorm_linear train),
or the environment variables LLMK_BENCH_GEMM_SHAPES / _M / _PARTS (comma-separated);
``--tokens`` / ``--hidden`` of the harness filter M and N too. The run prints its estimated
duration first (``estimate_s``); the default set, 67 cases and 148 rows, took 37 s on the H100
(25 s of it timing the cases), well inside a 10-minute GPU run.
Without a GPU: the CPU backend at small shapes (impl ``torch`` for F.linear's CPU GEMM)."""

import argparse
import os
import time

import torch
import torch.nn.functional as F

import llmk
from .. import timing
from ..views.common import sig
from ..views.gemm import OPS, is_gemm_row, markdown, plot  # noqa: F401

SHAPES = {  # name -> (N, K) = weight.shape
    "llama3_8b_qkv": (6144, 4096), "llama3_8b_o": (4096, 4096), "llama3_8b_gate_up": (28672, 4096),
    "llama3_8b_down": (4096, 14336), "qwen2.5_7b_qkv": (4608, 3584), "qwen2.5_7b_gate_up": (37888, 3584),
    "qwen2.5_7b_down": (3584, 18944),
}
SQUARES = {"square_4096": 4096, "square_8192": 8192}  # M = N = K
GROUPS = {"llama": [s for s in SHAPES if s.startswith("llama")], "qwen": [s for s in SHAPES if s.startswith("qwen")],
          "square": list(SQUARES)}
M_LIST = [1, 16, 64, 256, 2048, 8192, 16384]
FUSED_M = [2048, 8192]
RMSNORM_LINEAR_M = [1, 16, 64]
# op -> the shapes it runs on (name -> (N, K)); the GELU MLP is not one of the two models'.
FUSED = {"gemm_bias": {"qwen2.5_7b_qkv": SHAPES["qwen2.5_7b_qkv"]},
         "gemm_residual": {"llama3_8b_o": SHAPES["llama3_8b_o"], "llama3_8b_down": SHAPES["llama3_8b_down"]},
         "gemm_silu_mul": {"llama3_8b_gate_up": SHAPES["llama3_8b_gate_up"]},
         "gemm_gelu": {"gelu_mlp_4096_up": (16384, 4096)}}
RMSNORM_LINEAR = {"llama3_8b_qkv": SHAPES["llama3_8b_qkv"], "llama3_8b_gate_up": SHAPES["llama3_8b_gate_up"]}
TRAIN = {"llama3_8b_qkv": SHAPES["llama3_8b_qkv"], "llama3_8b_up": (14336, 4096),
         "llama3_8b_down": SHAPES["llama3_8b_down"]}
TRAIN_M = [2048, 8192]
PRODUCTS = {"gemm_train": 3}  # GEMMs of 2MNK FLOPs per call, where not 1: the forward, dx and dweight
PARTS = ("plain", "fused", "rmsnorm_linear", "train")
# Without a GPU: the reference backend at small shapes.
CPU = dict(shapes={"cpu_512x256": (512, 256), "cpu_256x512": (256, 512)}, squares={"square_256": 256},
           m=[1, 16, 64], fused_m=[64], rmsnorm_linear_m=[1, 16],
           fused={"gemm_bias": {"cpu_512x256": (512, 256)}, "gemm_residual": {"cpu_256x512": (256, 512)},
                  "gemm_silu_mul": {"cpu_512x256": (512, 256)}, "gemm_gelu": {"cpu_512x256": (512, 256)}},
           rmsnorm_linear={"cpu_512x256": (512, 256)}, train={"cpu_512x256": (512, 256)}, train_m=[64])
assert OPS == ("gemm", *FUSED, "rmsnorm_linear", "gemm_train")  # the view's names (views/gemm.py) are these cases
CHECK_ROWS, CHECK_COLS = 64, 1024
EPS = 1e-6
# The runtime model of estimate_s (an H100 SXM): achievable bf16 rate and HBM bandwidth, the
# calls per impl (warm-up, capture, one replay to settle, 7 timed replays of 20) and the fixed
# cost of a case (drawing inputs, the float64 check, capture).
# First measured (the H100, the first llmk kernels at about 350 TFLOP/s): the default set's
# 67 cases took 25 s to time, 37 s in all with the ceilings and Python's start; this predicts 29 s.
H100_TFLOPS, H100_GBS, CALLS_PER_IMPL, CASE_OVERHEAD_S = 600.0, 2800.0, 20 * 9 + 16, 0.1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("gemm (see bench/llmk_bench/suites/gemm.py)")
    g.add_argument("--gemm-shapes", nargs="+", metavar="SHAPE",
                   help=f"weight shapes of the plain sweep: names ({' '.join([*SHAPES, *SQUARES])}) or groups "
                        f"({' '.join(GROUPS)}); default all (env LLMK_BENCH_GEMM_SHAPES)")
    g.add_argument("--gemm-m", type=int, nargs="+", metavar="M",
                   help=f"rows of the plain sweep (default {' '.join(map(str, M_LIST))}; env LLMK_BENCH_GEMM_M)")
    g.add_argument("--gemm-parts", nargs="+", choices=PARTS, metavar="PART",
                   help=f"{' '.join(PARTS)} (default all; env LLMK_BENCH_GEMM_PARTS)")


def _env_list(name):
    value = os.environ.get(name, "").strip()
    return [v.strip() for v in value.split(",") if v.strip()] or None


def _selection(args, device):
    """(plain cases [(shape, m, n, k)], fused cases [(op, shape, m, n, k)], rmsnorm_linear cases)."""
    cpu = device == "cpu"
    shapes = CPU["shapes"] if cpu else SHAPES
    squares = CPU["squares"] if cpu else SQUARES
    names = getattr(args, "gemm_shapes", None) or _env_list("LLMK_BENCH_GEMM_SHAPES")
    wanted = None  # shape names every part is limited to (None: each part's own set)
    if names and not cpu:
        other = {name for cases in (*FUSED.values(), TRAIN, RMSNORM_LINEAR) for name in cases}
        # A group (llama, qwen): its plain shapes and every other part's shapes of that model.
        wanted = [s for n in names
                  for s in (GROUPS[n] + sorted(o for o in other if o.startswith(n) and o not in GROUPS[n])
                            if n in GROUPS else [n])]
        unknown = [n for n in wanted if n not in shapes and n not in squares and n not in other]
        if unknown:
            raise ValueError(f"gemm: unknown shapes {unknown}; known: {[*shapes, *squares, *sorted(other), *GROUPS]}")
        shapes = {n: shapes[n] for n in wanted if n in shapes}
        squares = {n: squares[n] for n in wanted if n in squares}
    m_list = getattr(args, "gemm_m", None) or [int(m) for m in _env_list("LLMK_BENCH_GEMM_M") or []]
    m_list = getattr(args, "tokens", None) or m_list or (CPU["m"] if cpu else M_LIST)
    parts = getattr(args, "gemm_parts", None) or _env_list("LLMK_BENCH_GEMM_PARTS") or PARTS
    hidden = getattr(args, "hidden", None)

    def keep(n, name=None):
        return (not hidden or n in hidden) and (wanted is None or name is None or name in wanted)

    plain = []
    if "plain" in parts:
        plain = [(name, m, n, k) for name, (n, k) in shapes.items() for m in m_list if keep(n)]
        plain += [(name, s, s, s) for name, s in squares.items() if keep(s)]
    tokens = getattr(args, "tokens", None)
    fused = []
    if "fused" in parts:
        fused_m = [m for m in tokens if m >= 256] if tokens else CPU["fused_m"] if cpu else FUSED_M
        fused = [(op, name, m, n, k) for op, cases in (CPU["fused"] if cpu else FUSED).items()
                 for name, (n, k) in cases.items() for m in fused_m if keep(n, name)]
    if "train" in parts:  # timed as the fused cases are (fused_case), three impls at most
        train_m = [m for m in tokens if m >= 256] if tokens else CPU["train_m"] if cpu else TRAIN_M
        fused += [("gemm_train", name, m, n, k) for name, (n, k) in (CPU["train"] if cpu else TRAIN).items()
                  for m in train_m if keep(n, name)]
    rl = []
    if "rmsnorm_linear" in parts:
        rl_m = [m for m in tokens if m <= 64] if tokens else CPU["rmsnorm_linear_m"] if cpu else RMSNORM_LINEAR_M
        rl = [("rmsnorm_linear", name, m, n, k)
              for name, (n, k) in (CPU["rmsnorm_linear"] if cpu else RMSNORM_LINEAR).items()
              for m in rl_m if keep(n, name)]
    return plain, fused, rl


def estimate_s(plain, fused, rl) -> float:
    """Predicted seconds of GPU time on an H100 (the runtime model above)."""
    total = 0.0
    for impls, cases in ((2, [("gemm", *c) for c in plain]), (3, fused + rl)):
        for op, _, m, n, k in cases:
            call = PRODUCTS.get(op, 1) * max(2 * m * n * k / (H100_TFLOPS * 1e12),
                                             2 * (m * k + n * k + m * n) / (H100_GBS * 1e9)) + 5e-6
            total += impls * (CALLS_PER_IMPL * call) + CASE_OVERHEAD_S
    return total


# --------------------------------------------------------------------------------------
# cases: each (make, impls {name: fn(*inputs)}, reference(inputs, rows, cols) -> float64
# [rows, cols] of the output, weight bytes, flops)


def _inputs(m, n, k, dtype, device, bias=False, residual=0, norm=False):
    def make():
        x = torch.randn(m, k, device=device, dtype=dtype)
        w = (torch.randn(n, k, device=device, dtype=dtype) * k**-0.5)
        out = [x, w]
        if norm:
            out.insert(1, (1 + 0.1 * torch.randn(k, device=device)).to(dtype))
        if bias:
            out.append(torch.randn(n, device=device, dtype=dtype) * 0.5)
        if residual:
            out.append(torch.randn(m, residual, device=device, dtype=dtype))
        return tuple(out)

    return make


def _peer_name(device):
    return "cublas" if device == "cuda" else "torch"


def plain_case(m, n, k, dtype, device):
    impls = {"llmk": lambda x, w: llmk.linear(x, w), _peer_name(device): lambda x, w: F.linear(x, w)}

    def reference(inputs, rows, cols):
        x, w = inputs
        return x[rows].double() @ w[cols].double().t()

    return _inputs(m, n, k, dtype, device), impls, reference


def fused_case(op, m, n, k, dtype, device):
    peer = _peer_name(device)
    if op == "gemm_bias":
        impls = {"llmk": lambda x, w, b: llmk.linear(x, w, b), "unfused": lambda x, w, b: F.linear(x, w) + b,
                 peer: lambda x, w, b: F.linear(x, w, b)}

        def reference(inputs, rows, cols):
            x, w, b = inputs
            return x[rows].double() @ w[cols].double().t() + b[cols].double()

        return _inputs(m, n, k, dtype, device, bias=True), impls, reference
    if op == "gemm_residual":
        impls = {"llmk": lambda x, w, r: llmk.linear(x, w, None, r), "unfused": lambda x, w, r: F.linear(x, w) + r,
                 peer: lambda x, w, r: torch.addmm(r, x, w.t())}

        def reference(inputs, rows, cols):
            x, w, r = inputs
            return x[rows].double() @ w[cols].double().t() + r[rows][:, cols].double()

        return _inputs(m, n, k, dtype, device, residual=n), impls, reference
    if op == "gemm_silu_mul":
        impls = {"llmk": lambda x, w: llmk.linear(x, w, None, None, "silu_mul"),
                 "unfused": lambda x, w: llmk.swiglu(*F.linear(x, w).chunk(2, dim=-1))}
        if device == "cuda":
            impls["compile"] = torch.compile(_linear_silu_mul)

        def reference(inputs, rows, cols):
            x, w = inputs
            xd = x[rows].double()
            gate, up = xd @ w[cols].double().t(), xd @ w[[c + n // 2 for c in cols]].double().t()
            return F.silu(gate) * up

        return _inputs(m, n, k, dtype, device), impls, reference
    if op == "gemm_gelu":
        impls = {"llmk": lambda x, w, b: llmk.linear(x, w, b, None, "gelu_tanh"),
                 "unfused": lambda x, w, b: llmk.bias_gelu(F.linear(x, w), b, "tanh"),
                 peer: lambda x, w, b: torch._addmm_activation(b, x, w.t(), use_gelu=True)}

        def reference(inputs, rows, cols):
            x, w, b = inputs
            return F.gelu(x[rows].double() @ w[cols].double().t() + b[cols].double(), approximate="tanh")

        return _inputs(m, n, k, dtype, device, bias=True), impls, reference
    if op == "gemm_train":
        def step(linear):
            return lambda x, w, dy: torch.autograd.grad(linear(x, w), (x, w), dy)[0]

        impls = {"llmk": step(llmk.linear), peer: step(F.linear)}

        def make():
            x, w = _inputs(m, n, k, dtype, device)()
            return x.requires_grad_(), w.requires_grad_(), torch.randn(m, n, device=device, dtype=dtype)

        def reference(inputs, rows, cols):  # dx = dy . w
            _, w, dy = inputs
            return dy[rows].double() @ w.detach()[:, cols].double()

        return make, impls, reference
    raise ValueError(op)


def _linear_silu_mul(x, w):
    """F.linear, then silu(gate) * up on its two halves: what torch.compile fuses (gemm_silu_mul)."""
    gate, up = F.linear(x, w).chunk(2, dim=-1)
    return F.silu(gate) * up


def rmsnorm_linear_case(m, n, k, dtype, device):
    impls = {"llmk": lambda x, g, w: llmk.rmsnorm_linear(x, g, w, EPS),
             "unfused": lambda x, g, w: F.linear(llmk.rmsnorm(x, g, EPS), w),
             "llmk 2 kernels": lambda x, g, w: llmk.linear(llmk.rmsnorm(x, g, EPS), w)}

    def reference(inputs, rows, cols):
        x, g, w = inputs
        xd = x[rows].double()
        y = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS) * g.double()
        return y @ w[cols].double().t()

    return _inputs(m, n, k, dtype, device, norm=True), impls, reference


def _spread(count, limit):
    """Up to `limit` indices spread evenly over range(count), the first and last included."""
    if count <= limit:
        return list(range(count))
    return sorted({round(i * (count - 1) / (limit - 1)) for i in range(limit)})


def _max_rel_err(out, inputs, reference):
    rows, cols = _spread(out.shape[0], CHECK_ROWS), _spread(out.shape[1], CHECK_COLS)
    ref = reference(inputs, rows, cols)
    got = out[rows][:, cols].double()
    return (got - ref).abs().max().item() / (ref.abs().max().item() or 1.0)


def matmul_row(op, dtype, m, n, k, impl, us, method, err, weight_bytes, info, **extra) -> dict:
    """A CSV row of an [m, k] x [k, n] product timed at `us`: the harness's columns, TFLOP/s and
    % of the run's GEMM rate, and for M <= 64 the weight's GB/s and % of copy; then `extra`."""
    tflops, gbs, small = PRODUCTS.get(op, 1) * 2 * m * n * k / us / 1e6, weight_bytes / us / 1e3, m <= 64
    return dict(op=op, dtype=str(dtype).replace("torch.", ""), tokens=m, hidden=n, impl=impl,
                time_us=round(us, 3), gbs=sig(gbs) if small else "",
                pct_copy=round(100 * gbs / info["copy_gbs"], 1) if small else "",
                max_rel_err=f"{err:.2e}", timing=method, copy_gbs=round(info["copy_gbs"]),
                empty_us=round(info["empty_us"], 3), tflops=sig(tflops),
                pct_gemm=round(100 * tflops / info["gemm"], 1), gemm_tflops=sig(info["gemm"]), k=k, **extra)


def _measure(op, shape, m, n, k, dtype, device, info, make, impls, reference, failures):
    """Rows of one case (every impl that ran); llmk's failure drops the case."""
    elt = torch.tensor([], dtype=dtype).element_size()
    n_out = n // 2 if op == "gemm_silu_mul" else n
    bytes_per_call = elt * (m * k + n * k + m * n_out + (m * n_out if op == "gemm_residual" else 0))
    if op == "gemm_train":  # dy, dx and dweight besides
        bytes_per_call = elt * 2 * (m * k + n * k + m * n)
    try:
        sets = timing.buffer_sets(make, bytes_per_call, device)
    except Exception as e:  # noqa: BLE001 - out of memory, say: report, go on
        failures.append(f"{op} {shape} M={m}: {type(e).__name__}: {e}")
        print(f"{op:15s} {shape:20s} M={m:6d}  skipped: {failures[-1]}", flush=True)
        return []
    weight_bytes = n * k * elt
    rows, times = [], {}
    for impl, fn, us, method, err in timing.time_each(
            impls, sets, device, lambda fn: _max_rel_err(fn(*sets[0]), sets[0], reference),
            f"{op} {shape} M={m}", f"{op:15s} {shape:20s} M={m:6d}", failures):
        times[impl] = us
        rows.append(matmul_row(op, dtype, m, n, k, impl, us, method, err, weight_bytes, info, shape=shape))
    del sets
    if device == "cuda":
        torch.cuda.empty_cache()
    if "llmk" not in times:
        return []
    line = "  ".join(f"{i} {t:9.2f}us" for i, t in times.items())
    print(f"{op:15s} {shape:20s} M={m:6d} N={n:6d} K={k:6d}  {line}", flush=True)
    return rows


def run(args, dtype, device, info, failures):
    """Every gemm case on `device`, one row per impl; failures collects what did not run."""
    plain, fused, rl = _selection(args, device)
    cases = len(plain) + len(fused) + len(rl)
    rows_expected = 2 * len(plain) + 3 * len(fused) + 3 * len(rl)
    estimate = f", about {estimate_s(plain, fused, rl):.0f} s on an H100" if device == "cuda" else ""
    print(f"gemm on {device}: {cases} cases, up to {rows_expected} rows{estimate}", flush=True)
    t0, rows = time.perf_counter(), []
    for shape, m, n, k in plain:
        rows += _measure("gemm", shape, m, n, k, dtype, device, info, *plain_case(m, n, k, dtype, device), failures)
    for op, shape, m, n, k in fused:
        rows += _measure(op, shape, m, n, k, dtype, device, info, *fused_case(op, m, n, k, dtype, device), failures)
    for op, shape, m, n, k in rl:
        rows += _measure(op, shape, m, n, k, dtype, device, info, *rmsnorm_linear_case(m, n, k, dtype, device),
                         failures)
    print(f"gemm: {len(rows)} rows in {time.perf_counter() - t0:.0f} s", flush=True)
    return rows
