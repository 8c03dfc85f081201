"""Benchmark cases of the quantized family (`--op quantized_linear`): weight-only quantized
``llmk.quantized_linear`` (W4A16, W8A16), bf16 activations, kernel times by the harness's
protocol (timing.time_cuda: CUDA graphs of 20 calls, median of 7 replays; input sets rotated so
that at least 256 MiB of quantized weight stream per cycle: a weight that fits the L2 is not
re-read from it at small M; every set has its own copy of every impl's weight).

- Formats: ``int4`` (4-bit codes, one bf16 scale per group of 128 input features) and ``int8``
  (8-bit codes, one scale per output channel: group = K), symmetric round-to-nearest
  (``llmk.quantize_weight``: W = (q - 2^(bits-1)) * s, no zero points), over the projections of
  Llama-3-8B (qkv 6144x4096, o 4096x4096, gate/up 28672x4096, down 4096x14336, and up alone
  14336x4096: the reference shape K 4096, N 14336), Llama-3-70B (up 28672x8192, down 8192x28672)
  and the Llama-3 LM head (128256x4096), (N, K) = weight.shape, at M = 1, 4, 16, 32, 64, 128,
  256, 1024, 4096 rows. Each weight is drawn and quantized once (on the CPU, rows split over the
  cores), before any timing.
- Impls: ``llmk`` (llmk.quantized_linear, its default path: the weight-streaming kernel at
  small M, dequantize-into-workspace + GEMM above; include/llmk/quantized_gemm.h says where it
  switches); at M = 64, 128, 256 also ``llmk_stream`` and ``llmk_dequant``, the two paths forced
  through LLMK_QUANTIZED_PATH (set around each call, so inside the CUDA graph's capture, where
  the path is chosen); ``cublas_bf16``: F.linear on
  the dequantized bf16 weight (llmk.dequantize_weight: the very weight the kernels multiply by),
  the dense baseline; for int4 ``tinygemm``: ``torch._weight_int4pack_mm(x, w, 128,
  scales_and_zeros)`` on ``torch._convert_weight_to_int4pack(codes as uint8 [N, K/2], 8)``,
  scales_and_zeros [K/128, N, 2] = (s, 0): tinygemm dequantizes to (q - 8) * s + 0 in bf16 (one
  fma), the same weight as llmk's (torch 2.11 on an H200: its product with the identity is
  llmk's dequantized weight bit for bit); for int8 ``int8pack``: ``torch._weight_int8pack_mm(x,
  q - 128 as int8 [N, K], s [N] bf16)``, up to M = 256 only (torch's CUDA kernel is one thread
  per output on the fp32 cores, 0.9 TFLOP/s); it scales the fp32 dot product, so its weight is
  (q - 128) * s unrounded, not llmk's bf16-rounded one (the difference is below the output's
  rounding: its error column stays about the dense baseline's). The codes of both come from
  llmk.dequantize_weight with unit scales (q - z exactly), not from llmk's packed layout.
  A peer (tinygemm, int8pack) whose one call times CALLS_PER_IMPL would pass PEER_BUDGET_S
  (calls over about 1.3 ms: tinygemm at M = 1024 and 4096, and from M = 64 to 256 on the
  larger weights; int8pack everywhere but at the smallest M of the 8B's smaller weights) is
  timed by one call after a warm-up instead (timing ``single``, with a note).

Columns: the harness's (tokens = M, hidden = N), plus ``k``, ``bits``, ``group`` (K: per
channel) and ``shape``; ``tflops`` and ``pct_gemm`` (of the same run's cuBLAS 8192^3 bf16
rate); for M <= 64 ``gbs`` is the impl's weight bytes (codes + scales, tinygemm's packed codes
+ scales and zeros, int8pack's int8 + scales, the bf16 weight for the dense baseline) over the
time and ``pct_copy`` that over the measured copy bandwidth (empty above 64 rows).
``max_rel_err``: max|out - ref| / max|ref| on up to 64 rows x 1024 columns against a float64
product with llmk's dequantized weight.

Trimming (a short GPU run): ``--qlinear-shapes`` (names, or the groups llama3_8b, llama3_70b,
lm_head), ``--qlinear-m`` (the M list), ``--qlinear-formats`` (int4 int8), or the environment
variables LLMK_BENCH_QLINEAR_SHAPES / _M / _FORMATS (comma-separated); ``--tokens`` /
``--hidden`` of the harness filter M and N too. The run prints its estimated duration first
(``estimate_s``, and the quantization on the CPU apart): for the default set, 144 cases and up to
512 rows, about 50 s on an H100 after about 4 s quantizing on 16 threads (in --all).
Without a GPU: the CPU backend at small shapes (impls ``torch_bf16`` for F.linear's CPU GEMM,
``int4pack`` for torch's CPU int4 op ``_weight_int4pack_mm_for_cpu``, ``int8pack``)."""

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

import llmk
from .. import timing
from ..views.quantized import OP, is_quantized_row, markdown, plot  # noqa: F401
from .gemm import _env_list, _max_rel_err, matmul_row

SHAPES = {  # name -> (N, K) = weight.shape
    "llama3_8b_qkv": (6144, 4096), "llama3_8b_o": (4096, 4096), "llama3_8b_gate_up": (28672, 4096),
    "llama3_8b_down": (4096, 14336), "llama3_8b_up": (14336, 4096), "llama3_70b_up": (28672, 8192),
    "llama3_70b_down": (8192, 28672), "llama3_lm_head": (128256, 4096),
}
GROUPS = {"llama3_8b": [s for s in SHAPES if s.startswith("llama3_8b")],
          "llama3_70b": [s for s in SHAPES if s.startswith("llama3_70b")], "lm_head": ["llama3_lm_head"]}
FORMATS = {"int4": (4, 128), "int8": (8, None)}  # name -> (bits, group size; None: K, one scale per channel)
M_LIST = [1, 4, 16, 32, 64, 128, 256, 1024, 4096]
PATH_M = [64, 128, 256]  # where llmk_stream and llmk_dequant are timed too (GPU only)
SM90_M_MAX = 128  # llmk_sm90 (int4, LLMK_QUANTIZED_PATH=sm90) too at PATH_M up to this (a Hopper GPU)
STREAM_M_MAX = 64  # the default path's switch as quantized_gemm.h gives it (the estimate's model only)
PATH_VAR = "LLMK_QUANTIZED_PATH"
INT8PACK_M_MAX = 256  # torch's CUDA int8pack kernel: one thread per output, fp32 cores
INNER_K_TILES = 8  # tinygemm's 16-byte loads of the packed weight (torchao's default)
# Without a GPU: the reference backend at small shapes.
CPU = dict(shapes={"cpu_512x256": (512, 256), "cpu_256x512": (256, 512)}, m=[1, 16, 64])
# A peer whose one call times CALLS_PER_IMPL passes PEER_BUDGET_S is timed by one call (see _one_call).
SLOW_PEERS, PEER_BUDGET_S = ("tinygemm", "int8pack"), 0.25
# The runtime model of estimate_s (an H100 SXM): as the gemm suite's (bf16 rate, HBM bandwidth,
# calls per impl, fixed cost of a case), plus the weight-streaming kernel's tensor-core rate (a
# guess), tinygemm's rate (29 TFLOP/s on an H200 from M = 256 up: mma.sync 16x8 tiles, a CTA
# each) and int8pack's (0.9 TFLOP/s and 150 GB/s of weight on the H200: one thread per output on
# the fp32 cores), the preparation of a weight (dequantize, torch's packings), and the CPU's
# time per element to quantize (one thread) and to draw and copy a weight.
# Measured on an H200 with llmk's three ops stood in for by torch (dequantize, then F.linear, at
# every M; everything else real): the default set's 144 cases, 512 rows, in 83 s, of which 9 s
# quantizing (the stand-in's torch ops), 58 s the stand-in's calls, 15 s cuBLAS's and the peers'
# (the model: 19 s), and under 1 s besides; with llmk's kernels at the model's times, about 40 s.
H100_TFLOPS, H100_GBS, CALLS_PER_IMPL, CASE_OVERHEAD_S = 600.0, 2800.0, 20 * 9 + 16, 0.05
STREAM_TFLOPS, TINYGEMM_TFLOPS, INT8PACK_TFLOPS, INT8PACK_GBS = 300.0, 29.0, 0.9, 150.0
PREPARE_S, QUANTIZE_NS, DRAW_NS = 0.3, 8.0, 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("quantized_linear (see bench/llmk_bench/suites/quantized.py)")
    g.add_argument("--qlinear-shapes", nargs="+", metavar="SHAPE",
                   help=f"weight shapes: names ({' '.join(SHAPES)}) or groups ({' '.join(GROUPS)}); default all "
                        "(env LLMK_BENCH_QLINEAR_SHAPES)")
    g.add_argument("--qlinear-m", type=int, nargs="+", metavar="M",
                   help=f"rows (default {' '.join(map(str, M_LIST))}; env LLMK_BENCH_QLINEAR_M)")
    g.add_argument("--qlinear-formats", nargs="+", choices=list(FORMATS), metavar="FORMAT",
                   help=f"{' '.join(FORMATS)} (default both; env LLMK_BENCH_QLINEAR_FORMATS)")


def _selection(args, device):
    """(shapes {name: (N, K)}, M list, formats {name: (bits, group or None)})."""
    cpu = device == "cpu"
    shapes = CPU["shapes"] if cpu else SHAPES
    names = getattr(args, "qlinear_shapes", None) or _env_list("LLMK_BENCH_QLINEAR_SHAPES")
    if names and not cpu:
        wanted = [s for n in names for s in GROUPS.get(n, [n])]
        unknown = [n for n in wanted if n not in shapes]
        if unknown:
            raise ValueError(f"quantized_linear: unknown shapes {unknown}; known: {[*shapes, *GROUPS]}")
        shapes = {n: shapes[n] for n in wanted}
    hidden = getattr(args, "hidden", None)
    shapes = {name: nk for name, nk in shapes.items() if not hidden or nk[0] in hidden}
    m_list = getattr(args, "qlinear_m", None) or [int(m) for m in _env_list("LLMK_BENCH_QLINEAR_M") or []]
    m_list = getattr(args, "tokens", None) or m_list or (CPU["m"] if cpu else M_LIST)
    formats = getattr(args, "qlinear_formats", None) or _env_list("LLMK_BENCH_QLINEAR_FORMATS") or list(FORMATS)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ValueError(f"quantized_linear: unknown formats {unknown}; known: {list(FORMATS)}")
    return shapes, m_list, {f: FORMATS[f] for f in formats}


def _peer_names(device):
    """(the dense baseline, {bits: torch's integer-weight op}) on `device`."""
    cpu = device == "cpu"
    return ("torch_bf16" if cpu else "cublas_bf16"), {4: "int4pack" if cpu else "tinygemm", 8: "int8pack"}


def _impl_names(m, bits, device):
    dense, ints = _peer_names(device)
    names = ["llmk"]
    if device == "cuda" and m in PATH_M:
        names += ["llmk_stream", "llmk_dequant"] + (["llmk_sm90"] if bits == 4 and m <= SM90_M_MAX else [])
    names.append(dense)
    if not (bits == 8 and device == "cuda" and m > INT8PACK_M_MAX):
        names.append(ints[bits])
    return names


def _call_s(impl, m, n, k, bits, group):
    """Predicted seconds of one call on an H100 (the runtime model above)."""
    flops, act = 2 * m * n * k, 2 * (m * k + m * n)
    qbytes = n * k * bits // 8 + 2 * n * (k // group)
    if impl == "llmk_dequant" or (impl == "llmk" and m > STREAM_M_MAX):  # dequantize into the workspace, then the GEMM
        return (qbytes + 4 * n * k + act) / (H100_GBS * 1e9) + flops / (H100_TFLOPS * 1e12) + 10e-6
    if impl == "int8pack":
        return qbytes / (INT8PACK_GBS * 1e9) + flops / (INT8PACK_TFLOPS * 1e12)
    rate, weight = {"llmk": (STREAM_TFLOPS, qbytes), "llmk_stream": (STREAM_TFLOPS, qbytes),
                    "tinygemm": (TINYGEMM_TFLOPS, qbytes)}.get(impl, (H100_TFLOPS, 2 * n * k))
    return max((weight + act) / (H100_GBS * 1e9), flops / (rate * 1e12)) + 5e-6


def estimate_s(shapes, m_list, formats) -> float:
    """Predicted seconds of GPU time on an H100 (the runtime model above), the CPU quantization apart."""
    total = 0.0
    for n, k in shapes.values():
        for bits, group in formats.values():
            total += PREPARE_S
            for m in m_list:
                total += CASE_OVERHEAD_S
                for impl in _impl_names(m, bits, "cuda"):
                    call = _call_s(impl, m, n, k, bits, group or k)
                    slow = impl in SLOW_PEERS and call * CALLS_PER_IMPL > PEER_BUDGET_S
                    total += (2 if slow else 2 + CALLS_PER_IMPL) * call
    return total


def quantize_estimate_s(shapes, formats, threads) -> float:
    """Predicted seconds to draw and quantize the weights on `threads` CPU threads."""
    elements = sum(n * k for n, k in shapes.values())
    return elements * (len(formats) * QUANTIZE_NS / threads + DRAW_NS) * 1e-9


# --------------------------------------------------------------------------------------
# weights: drawn and quantized once per (shape, format); each case's sets copy them


def _quantize(weight, bits, group, threads):
    """llmk.quantize_weight of a CPU weight, its rows split over `threads` threads (the rows'
    groups are independent: the same tensors as one call)."""
    n = weight.shape[0]
    rows = max(64, -(-n // (4 * threads)))
    parts = [weight[i:i + rows] for i in range(0, n, rows)]
    if threads <= 1 or len(parts) == 1:
        outs = [llmk.quantize_weight(p, bits, group) for p in parts]
    else:
        with ThreadPoolExecutor(threads) as pool:
            outs = list(pool.map(lambda p: llmk.quantize_weight(p, bits, group), parts))
    return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])


def quantize_all(shapes, formats, dtype, device, threads):
    """{(shape, format): (packed, scales)} on `device`: each weight drawn once (randn / sqrt(K),
    seeded by its shape) and quantized on the CPU."""
    out = {}
    for name, (n, k) in shapes.items():
        gen = torch.Generator(device=device).manual_seed(n * 100003 + k)
        w = (torch.randn(n, k, device=device, generator=gen) * k**-0.5).to(dtype).cpu()
        for f, (bits, group) in formats.items():
            packed, scales = _quantize(w, bits, group or k, threads)
            out[name, f] = packed.to(device), scales.to(device)
        del w
    return out


def prepare(packed, scales, bits, group, device, failures, label):
    """What a case's sets copy from one quantized weight: dict(packed, scales, w: the dequantized
    weight (the dense baseline's), peer: torch's integer packing of the same codes (() when it
    failed), bytes: {impl: weight bytes})."""
    w = llmk.dequantize_weight(packed, scales, None, bits, group)
    dense, ints = _peer_names(device)
    llmk_bytes = packed.numel() * 4 + scales.numel() * scales.element_size()
    nbytes = {"llmk": llmk_bytes, "llmk_stream": llmk_bytes, "llmk_dequant": llmk_bytes, "llmk_sm90": llmk_bytes,
              dense: w.numel() * w.element_size()}
    peer = ()
    try:
        # q - z exactly: |q - z| <= 128 is a bf16 integer, and a unit scale rounds nothing.
        codes = llmk.dequantize_weight(packed, torch.ones_like(scales), None, bits, group)
        if bits == 4:
            if group not in (32, 64, 128, 256):
                raise ValueError(f"tinygemm takes groups of 32, 64, 128 or 256, not {group}")
            q = codes.to(torch.int32) + 8  # tinygemm's codes: w = (q - 8) * scale + zero
            if device == "cuda":  # uint8 [N, K/2], code 2i in the high nibble of byte i
                packed_peer = torch._convert_weight_to_int4pack(
                    ((q[:, 0::2] << 4) | q[:, 1::2]).to(torch.uint8).contiguous(), INNER_K_TILES)
            else:
                packed_peer = torch._convert_weight_to_int4pack_for_cpu(q.contiguous(), INNER_K_TILES)
            s = scales.t()
            peer = (packed_peer, torch.stack([s, torch.zeros_like(s)], dim=-1).contiguous())  # [K/G, N, 2]
        else:
            if group != codes.shape[1]:
                raise ValueError("int8pack takes one scale per output channel")
            peer = (codes.to(torch.int8).contiguous(), scales[:, 0].contiguous())
        nbytes[ints[bits]] = sum(t.numel() * t.element_size() for t in peer)
        del codes
    except Exception as e:  # noqa: BLE001 - a torch without the op, say: report, time the rest
        failures.append(f"{label} {ints[bits]}: {type(e).__name__}: {str(e)[:300]}")
        print(f"{label}  {ints[bits]} failed: {failures[-1]}", flush=True)
        peer = ()
    return dict(packed=packed, scales=scales, w=w, peer=peer, bytes=nbytes)


# --------------------------------------------------------------------------------------
# cases


def _forced(path, bits, group):
    """llmk.quantized_linear with LLMK_QUANTIZED_PATH=path for the call (the C++ reads it per call)."""
    return timing.with_env(PATH_VAR, path, lambda x, packed, scales, *_: llmk.quantized_linear(
        x, packed, scales, None, bits, group))


def impls_of(m, bits, group, device, has_peer):
    """{impl: fn(x, packed, scales, w, *peer tensors)} of a case, llmk first."""
    dense, ints = _peer_names(device)
    fns = {"llmk": lambda x, p, s, *_: llmk.quantized_linear(x, p, s, None, bits, group),
           "llmk_stream": _forced("stream", bits, group), "llmk_dequant": _forced("dequant", bits, group),
           "llmk_sm90": _forced("sm90", bits, group),
           dense: lambda x, p, s, w, *_: F.linear(x, w),
           "tinygemm": lambda x, p, s, w, b, sz: torch._weight_int4pack_mm(x, b, group, sz),
           "int4pack": lambda x, p, s, w, b, sz: torch._weight_int4pack_mm_for_cpu(x, b, group, sz),
           "int8pack": lambda x, p, s, w, b, sc: torch._weight_int8pack_mm(x, b, sc)}
    return {name: fns[name] for name in _impl_names(m, bits, device) if has_peer or name != ints[bits]}


def _reference(inputs, rows, cols):
    x, w = inputs[0], inputs[3]
    return x[rows].double() @ w[cols].double().t()


def _make(m, k, dtype, device, weights):
    """make() of timing.buffer_sets: a fresh x, and the weights (copies after the first set)."""
    calls = []

    def make():
        x = torch.randn(m, k, device=device, dtype=dtype)
        copy = [t.clone() for t in weights] if calls else list(weights)
        calls.append(1)
        return (x, *copy)

    return make


def _one_call(fn, inputs):
    """(seconds, max_rel_err) of fn(*inputs) on the GPU: a warm-up call, whose output gives the
    error, then one call between CUDA events (a call this slow is no launch or cache measurement)."""
    err = _max_rel_err(fn(*inputs), inputs, _reference)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn(*inputs)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3, err


def _measure(shape, fmt, m, n, k, bits, group, dtype, device, info, prepared, failures):
    """Rows of one case (every impl that ran); llmk's failure drops the case."""
    peer, nbytes = prepared["peer"], prepared["bytes"]
    label, line = f"{OP} {shape} {fmt} M={m}", f"{fmt:5s} {shape:16s} M={m:5d}"
    impls = impls_of(m, bits, group, device, bool(peer))
    elt = torch.tensor([], dtype=dtype).element_size()
    try:
        weights = (prepared["packed"], prepared["scales"], prepared["w"], *peer)
        sets = timing.buffer_sets(_make(m, k, dtype, device, weights),
                                  nbytes["llmk"] + elt * (m * k + m * n), device)
    except Exception as e:  # noqa: BLE001 - out of memory, say: report, go on
        failures.append(f"{label}: {type(e).__name__}: {e}")
        print(f"{line}  skipped: {failures[-1]}", flush=True)
        return []

    def error_of(fn):
        return _max_rel_err(fn(*sets[0]), sets[0], _reference)

    slow = {}  # name -> (seconds, error) of a peer too slow for the graph protocol's calls
    if device == "cuda":
        for name in [i for i in impls if i in SLOW_PEERS]:
            try:
                seconds, err = _one_call(impls[name], sets[0])
            except Exception as e:  # noqa: BLE001 - report, time the rest
                failures.append(f"{label} {name}: {type(e).__name__}: {str(e)[:300]}")
                print(f"{line}  {name} failed: {failures[-1]}", flush=True)
                del impls[name]
                continue
            if seconds * CALLS_PER_IMPL > PEER_BUDGET_S:
                del impls[name]
                slow[name] = seconds, err
    rows, times = [], {}

    def add(impl, us, method, err, note=""):
        times[impl] = us
        rows.append(matmul_row(OP, dtype, m, n, k, impl, us, method, err, nbytes[impl], info, bits=bits,
                               group=group, shape=shape))
        if note:
            rows[-1]["note"] = note

    int8_note = "weight (q - 128) * s unrounded (it scales the fp32 dot product); error against llmk's bf16 weight"
    for impl, fn, us, method, err in timing.time_each(impls, sets, device, error_of, label, line, failures):
        add(impl, us, method, err, int8_note if impl == "int8pack" else "")
    if "llmk" in times:
        for name, (seconds, err) in slow.items():
            note = f"one call after a warm-up (the graph protocol's calls would take over {PEER_BUDGET_S:g} s)"
            add(name, seconds * 1e6, "single", err, note + ("; " + int8_note if name == "int8pack" else ""))
    del sets
    if device == "cuda":
        torch.cuda.empty_cache()
    if "llmk" not in times:
        return []
    print(f"{line} N={n:6d} K={k:5d}  " + "  ".join(f"{i} {t:9.2f}us" for i, t in times.items()), flush=True)
    return rows


def run(args, dtype, device, info, failures):
    """Every quantized_linear case on `device`, one row per impl; failures collects what did not run."""
    shapes, m_list, formats = _selection(args, device)
    cases = len(shapes) * len(formats) * len(m_list)
    rows_expected = sum(len(_impl_names(m, bits, device)) for _ in shapes for bits, _ in formats.values()
                        for m in m_list)
    threads = min(16, os.cpu_count() or 1) if device == "cuda" else 1
    estimate = (f", about {estimate_s(shapes, m_list, formats):.0f} s on an H100 after about "
                f"{quantize_estimate_s(shapes, formats, threads):.0f} s quantizing on {threads} CPU threads"
                if device == "cuda" else "")
    print(f"quantized_linear on {device}: {cases} cases, up to {rows_expected} rows{estimate}", flush=True)
    if os.environ.get(PATH_VAR):
        print(f"quantized_linear: {PATH_VAR}={os.environ[PATH_VAR]} is set: impl llmk takes that path", flush=True)
    t0 = time.perf_counter()
    try:
        weights = quantize_all(shapes, formats, dtype, device, threads)
    except Exception as e:  # noqa: BLE001 - llmk without the op, say: nothing to time
        failures.append(f"{OP} quantize_weight: {type(e).__name__}: {str(e)[:300]}")
        print(f"quantized_linear: skipped: {failures[-1]}", flush=True)
        return []
    print(f"quantized_linear: {len(weights)} weights quantized in {time.perf_counter() - t0:.1f} s", flush=True)
    rows = []
    for shape, fmt in list(weights):
        n, k = shapes[shape]
        bits, group = formats[fmt]
        group = group or k
        try:
            prepared = prepare(*weights.pop((shape, fmt)), bits, group, device, failures, f"{OP} {shape} {fmt}")
        except Exception as e:  # noqa: BLE001 - the dequantized weight did not come: report, go on
            failures.append(f"{OP} {shape} {fmt}: {type(e).__name__}: {str(e)[:300]}")
            print(f"{fmt:5s} {shape:16s}  skipped: {failures[-1]}", flush=True)
            continue
        for m in m_list:
            rows += _measure(shape, fmt, m, n, k, bits, group, dtype, device, info, prepared, failures)
        del prepared
        if device == "cuda":
            torch.cuda.empty_cache()
    print(f"quantized_linear: {len(rows)} rows in {time.perf_counter() - t0:.0f} s", flush=True)
    return rows
