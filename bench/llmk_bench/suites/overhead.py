"""The `overhead` suite: what an eager PyTorch user pays per call, beside the
closest PyTorch native counterpart. Two parts:

(a) Host time per call, op ``<name>_host``: every llmk forward op at a tiny shape (one
    1 x 4096 bf16 row; attention at batch 1, seq 16, 32 heads of 128; AdamW over 4 fp32
    tensors of 4096) next to its native counterpart (the ``counterpart`` column names it).
    Method: the GPU idle (synchronize first), 200 warm-up calls, then loops of 2000 calls
    timed with time.perf_counter around the loop, nothing in the loop waiting on the GPU;
    host time per call = loop time / calls, the median of 7 loops. The guard: tiny kernels
    take 2-5 us on the GPU, less than a call's host time, so the GPU keeps up and idles
    between launches; were it slower, its launch queue (about a thousand launches) would
    fill and block the host, and the loop would time the GPU instead. Each loop therefore
    also records how long the GPU needed after the host's last call to drain (``drain_us``):
    more than 2% of the loop (and 200 us) means the GPU fell behind. Then the op is timed
    again in loops of 200 calls, too few to fill the queue at up to 5 launches a call, and
    the row says so in its ``queue`` column ("ok", or "gpu behind: 200-call loops").
    Without a GPU: the same loops on CPU tensors (200 calls after 20, median of 5): host
    time of the CPU path, compute included.

(b) Eager training step through autograd, ops ``<name>_fwd_bwd_wall`` and
    ``<name>_fwd_bwd_kernel``, for the ops that train (rmsnorm, layernorm, silu_and_mul,
    swiglu, softmax, rmsnorm_swiglu, bias_gelu) at 8192 x 4096 bf16 (for the gated forms
    the output is [8192, 4096]): inputs and weights require grad, an iteration is
    ``y = op(x, w); y.backward(dy)`` with the grads set to None after it. Wall time per
    iteration: perf_counter around 20 iterations with a synchronize before and after, the
    median of 5 loops (``gpu_span_us``: CUDA events around the same loops, which equal the
    kernel time only while the host keeps ahead). Kernel time per iteration: the sum of the
    durations of every CUDA kernel (and memset/memcpy) that torch.profiler records over 10
    iterations, divided by 10 (``kernels``: how many per iteration); it is the GPU's busy
    time, whatever the host does. Without a GPU: wall time only, at 256 x 1024.

The tables, the plot and the limits they check are in views/overhead.py.
"""

import statistics
import time

import torch
import torch.nn.functional as F

import llmk
from .. import timing
from ..views.overhead import is_overhead_row, markdown, plot  # noqa: F401
from .activation import eager_bias_gelu, eager_gelu_tanh_and_mul, eager_silu_and_mul, eager_swiglu
from .norm import EPS
from .optim import optimizers
from .rope import MAX_POSITION, THETA, _split, torch_rope_cache

HOST_LOOPS = {"cuda": (2000, 200, 7), "cpu": (200, 20, 5)}  # calls per loop, warm-up calls, loops
SHORT_LOOP = 200  # calls per loop when the GPU fell behind: fewer launches than the queue holds
TRAIN_SHAPE = {"cuda": (8192, 4096), "cpu": (256, 1024)}
TRAIN_LOOPS = {"cuda": (20, 5), "cpu": (3, 5)}  # iterations per loop, loops
PROFILED_ITERS = 10


# --------------------------------------------------------------------------------------
# (a) host time per call


def host_cases(dtype, device):
    """name -> (shape, inputs, llmk call, {impl: (counterpart, native call)}); calls take *inputs."""
    d = 4096

    def randn(*shape, dt=dtype):
        return torch.randn(*shape, device=device, dtype=dt)

    x, r, w, b, x2 = randn(1, d), randn(1, d), randn(d), randn(d), randn(1, 2 * d)
    row = "1 x 4096"

    def add_rms_norm(x, r, w):
        s = x + r
        return F.rms_norm(s, (d,), w, EPS), s

    def add_rms_norm_(x, r, w):  # vLLM's native fused_add_rms_norm: residual += x, then norm
        r.add_(x)
        return F.rms_norm(r, (d,), w, EPS)

    heads_q, heads_kv, dim = 32, 8, 128  # Llama-3-8B
    qkv, positions = randn(1, (heads_q + 2 * heads_kv) * dim), torch.zeros(1, dtype=torch.long, device=device)
    cache = llmk.rope_cos_sin_cache(MAX_POSITION, dim, THETA, device=device)
    q, k, v = (randn(1, 16, 32, 128) for _ in range(3))  # [batch, seq, heads, head_dim]
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # torch's [batch, heads, seq, head_dim]
    builders = optimizers(capturable=False)
    steps = {}
    for name in ("llmk", "fused"):
        params = [randn(d, dt=torch.float32) for _ in range(4)]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-2
        steps[name] = builders[name](params).step

    return {
        "rmsnorm": (row, (x, w), lambda x, w: llmk.rmsnorm(x, w, EPS),
                    {"torch": ("F.rms_norm", lambda x, w: F.rms_norm(x, (d,), w, EPS))}),
        "add_rmsnorm": (row, (x, r, w), lambda x, r, w: llmk.add_rmsnorm(x, r, w, EPS),
                        {"torch": ("x + r; F.rms_norm", add_rms_norm)}),
        "add_rmsnorm_": (row, (x.clone(), r.clone(), w), lambda x, r, w: llmk.add_rmsnorm_(x, r, w, EPS),
                         {"torch": ("r.add_(x); F.rms_norm", add_rms_norm_)}),
        "layernorm": (row, (x, w, b), lambda x, w, b: llmk.layernorm(x, w, b, EPS),
                      {"torch": ("F.layer_norm", lambda x, w, b: F.layer_norm(x, (d,), w, b, EPS))}),
        "rmsnorm_swiglu": (row, (x, r, w), lambda x, g, w: llmk.rmsnorm_swiglu(x, g, w, EPS),
                           {"torch": ("F.rms_norm(x) * F.silu(g)",
                                      lambda x, g, w: F.rms_norm(x, (d,), w, EPS) * F.silu(g))}),
        "silu_and_mul": ("1 x 2*4096", (x2,), llmk.silu_and_mul, {"torch": ("F.silu(g) * u", eager_silu_and_mul)}),
        "gelu_and_mul": ("1 x 2*4096", (x2,), lambda x: llmk.gelu_and_mul(x, "tanh"),
                         {"torch": ("F.gelu(g, 'tanh') * u", eager_gelu_tanh_and_mul)}),
        "swiglu": (row, (x, r), llmk.swiglu, {"torch": ("F.silu(g) * u", eager_swiglu)}),
        "bias_gelu": (row, (x, b), lambda x, b: llmk.bias_gelu(x, b, "tanh"),
                      {"torch": ("F.gelu(x + b, 'tanh')", eager_bias_gelu)}),
        "softmax": (row, (x,), llmk.softmax, {"torch": ("torch.softmax", lambda x: torch.softmax(x, -1))}),
        "log_softmax": (row, (x,), llmk.log_softmax,
                        {"torch": ("torch.log_softmax", lambda x: torch.log_softmax(x, -1))}),
        # No native op rotates: the counterparts are vLLM's native rotary (14 ops) and one
        # native op of the same inputs (the gather of cos/sin rows by position it starts with).
        "rope_": ("1 token, 32/8 heads of 128", (*_split(qkv, heads_q, heads_kv, dim), positions),
                  lambda q, k, pos: llmk.rope_(q, k, pos, cache),
                  {"torch": ("vLLM native rotary", lambda q, k, pos: torch_rope_cache(q, k, pos, cache)),
                   "torch 1 op": ("torch.index_select(cache)", lambda q, k, pos: torch.index_select(cache, 0, pos))}),
        "attention": ("1 x 16 x 32 heads x 128", (q, k, v), llmk.attention,
                      {"torch": ("F.scaled_dot_product_attention",  # on its own [batch, heads, seq, dim] copies
                                 lambda *_: F.scaled_dot_product_attention(qt, kt, vt))}),
        "scaled_dot_product_attention": ("1 x 32 heads x 16 x 128", (qt, kt, vt), llmk.scaled_dot_product_attention,
                                         {"torch": ("F.scaled_dot_product_attention",
                                                    F.scaled_dot_product_attention)}),
        "adamw": ("4 fp32 tensors of 4096", (), steps["llmk"],
                  {"torch": ("torch.optim.AdamW(fused=True).step", steps["fused"])}),
    }


def _host_loops(fn, args, device, calls, loops):
    """Per-call host microseconds of `loops` loops of `calls` calls, and the longest GPU
    drain after a loop's last call (0 on the CPU)."""
    per_call, drain = [], 0.0
    for _ in range(loops):
        timing.sync(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        t1 = time.perf_counter()
        timing.sync(device)
        if device == "cuda":
            drain = max(drain, time.perf_counter() - t1)
        per_call.append((t1 - t0) / calls)
    return [t * 1e6 for t in per_call], drain * 1e6


def host_time(fn, args, device) -> dict:
    """Median host microseconds per call of fn(*args), the queue guard's verdict with it."""
    calls, warmup, loops = HOST_LOOPS[device]
    for _ in range(warmup):
        fn(*args)
    times, drain = _host_loops(fn, args, device, calls, loops)
    queue = "ok" if device == "cuda" else "-"  # the CPU has no launch queue
    if drain > max(200.0, 0.02 * statistics.median(times) * calls):
        queue = f"gpu behind ({drain:.0f} us drain): {SHORT_LOOP}-call loops"
        times, drain = _host_loops(fn, args, device, SHORT_LOOP, loops * calls // SHORT_LOOP)
    return dict(time_us=round(statistics.median(times), 2), drain_us=round(drain, 1), queue=queue)


def _measure_all(label, impls, measure, failures):
    """{impl: measure(fn)} for every (counterpart, fn) of impls, or None once one fails (reported
    in failures): a row without its counterpart compares nothing."""
    results = {}
    for impl, (_, fn) in impls.items():
        try:
            results[impl] = measure(fn)
        except Exception as e:  # noqa: BLE001 - report, go on with the next op
            failures.append(f"{label} {impl}: {type(e).__name__}: {e}")
            print(f"{label:34s} failed: {failures[-1]}", flush=True)
            return None
    return results


def run_host(dtype, device, failures):
    rows = []
    for name, (shape, args, ours, peers) in host_cases(dtype, device).items():
        impls = {"llmk": ("llmk." + name, ours), **peers}
        results = _measure_all(f"{name}_host", impls, lambda fn: host_time(fn, args, device), failures)
        if results is None:
            continue
        dt = str(args[0].dtype if args else torch.float32).replace("torch.", "")  # AdamW: fp32 parameters
        for impl, (counterpart, _) in impls.items():
            rows.append(dict(op=f"{name}_host", dtype=dt, tokens=1, hidden=4096, impl=impl, gbs="", pct_copy="",
                             max_rel_err="", timing="host", counterpart=counterpart, shape=shape, **results[impl]))
        line = "  ".join(f"{k} {v['time_us']:7.2f}us" + (" (gpu behind)" if v["queue"].startswith("gpu") else "")
                         for k, v in results.items())
        print(f"{name + '_host':34s} {line}", flush=True)
    return rows


# --------------------------------------------------------------------------------------
# (b) eager fwd+bwd through autograd


def training_cases(tokens, d, dtype, device):
    """name -> (leaf shapes, llmk forward, (counterpart, native forward)); the forwards take the leaves."""
    rows, weight = (tokens, d), (d,)
    return {
        "rmsnorm": ([rows, weight], lambda x, w: llmk.rmsnorm(x, w, EPS),
                    ("F.rms_norm", lambda x, w: F.rms_norm(x, (d,), w, EPS))),
        "layernorm": ([rows, weight, weight], lambda x, w, b: llmk.layernorm(x, w, b, EPS),
                      ("F.layer_norm", lambda x, w, b: F.layer_norm(x, (d,), w, b, EPS))),
        "silu_and_mul": ([(tokens, 2 * d)], llmk.silu_and_mul, ("F.silu(g) * u", eager_silu_and_mul)),
        "swiglu": ([rows, rows], llmk.swiglu, ("F.silu(g) * u", eager_swiglu)),
        "softmax": ([rows], llmk.softmax, ("torch.softmax", lambda x: torch.softmax(x, -1))),
        "rmsnorm_swiglu": ([rows, rows, weight], lambda x, g, w: llmk.rmsnorm_swiglu(x, g, w, EPS),
                           ("F.rms_norm(x) * F.silu(g)", lambda x, g, w: F.rms_norm(x, (d,), w, EPS) * F.silu(g))),
        "bias_gelu": ([rows, weight], lambda x, b: llmk.bias_gelu(x, b, "tanh"),
                      ("F.gelu(x + b, 'tanh')", eager_bias_gelu)),
    }


def fwd_bwd_times(forward, leaves, dy, device) -> dict:
    """Wall (and on the GPU: event span and profiled kernel) microseconds per eager iteration."""
    def step():
        forward(*leaves).backward(dy)
        for t in leaves:
            t.grad = None

    iters, loops = TRAIN_LOOPS[device]
    for _ in range(3):
        step()
    walls, spans = [], []
    for _ in range(loops):
        timing.sync(device)
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        if device == "cuda":
            end.record()
        timing.sync(device)
        walls.append((time.perf_counter() - t0) * 1e6 / iters)
        if device == "cuda":
            spans.append(start.elapsed_time(end) * 1e3 / iters)
    out = dict(wall_us=statistics.median(walls))
    if device == "cuda":
        out["gpu_span_us"] = statistics.median(spans)
        out.update(profiled_kernels(step))
    return out


def profiled_kernels(step) -> dict:
    """The GPU's busy time per call of step(): the summed durations of the CUDA kernels (and
    memsets/memcpys) torch.profiler records over PROFILED_ITERS calls, and their count."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], acc_events=True) as prof:
        for _ in range(PROFILED_ITERS):
            step()
        torch.cuda.synchronize()
    gpu = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    return dict(kernel_us=sum(e.time_range.elapsed_us() for e in gpu) / PROFILED_ITERS,
                kernels=round(len(gpu) / PROFILED_ITERS, 1))


def run_training(dtype, device, failures):
    tokens, d = TRAIN_SHAPE[device]
    rows = []
    for name, (shapes, ours, peer) in training_cases(tokens, d, dtype, device).items():
        leaves = [torch.randn(*s, device=device, dtype=dtype, requires_grad=True) for s in shapes]
        dy = torch.randn(tokens, d, device=device, dtype=dtype)
        impls = {"llmk": ("llmk." + name, ours), "torch": peer}
        results = _measure_all(f"{name}_fwd_bwd", impls, lambda fn: fwd_bwd_times(fn, leaves, dy, device), failures)
        del leaves, dy
        if results is None:
            continue
        for impl, (counterpart, _) in impls.items():
            t = results[impl]
            common = dict(dtype=str(dtype).replace("torch.", ""), tokens=tokens, hidden=d, impl=impl, gbs="",
                          pct_copy="", max_rel_err="", counterpart=counterpart, shape=f"{tokens} x {d}")
            span = {"gpu_span_us": round(t["gpu_span_us"], 2)} if "gpu_span_us" in t else {}
            rows.append(dict(op=f"{name}_fwd_bwd_wall", time_us=round(t["wall_us"], 2), timing="wall", **common,
                             **span))
            if "kernel_us" in t:
                rows.append(dict(op=f"{name}_fwd_bwd_kernel", time_us=round(t["kernel_us"], 2), timing="profiler",
                                 kernels=t["kernels"], **common))
        line = "  ".join(f"{k} wall {v['wall_us']:9.1f}us" + (f" kernel {v['kernel_us']:9.1f}us" if "kernel_us" in v
                                                               else "") for k, v in results.items())
        print(f"{name + '_fwd_bwd':34s} {line}", flush=True)
    return rows


def run(dtype, device, failures):
    """Every row of the overhead case on `device`; failures collects what did not run."""
    print(f"overhead on {device}: host time per call of each forward op (median of {HOST_LOOPS[device][2]} loops "
          f"of {HOST_LOOPS[device][0]} calls), then eager fwd+bwd at {' x '.join(map(str, TRAIN_SHAPE[device]))}",
          flush=True)
    return run_host(dtype, device, failures) + run_training(dtype, device, failures)
