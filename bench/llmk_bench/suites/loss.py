"""Benchmark cases of the loss family, bf16 logits: cross_entropy forward + backward
(reduction "mean", the gradient of the logits) against F.cross_entropy through autograd, its
torch.compile, and Liger-Kernel's cross-entropy where it is installed. `hidden` is the vocabulary
(Llama-2 32000, Llama-3 128256). Bytes: the ideal fwd+bwd, read the logits twice and write
their gradient once. Each case is case(tokens, vocab, dtype, device) -> (bytes moved, make,
impls, reference).

``fused_linear_cross_entropy`` (GPU only; not a sweep of the harness: its rows have their own
columns, peak memory beside time): :func:`run_fused_linear_cross_entropy`, run by
``python -m llmk_bench.suites.loss [--csv F] [--table F]``. The LM head and its loss, forward +
backward (the gradients of hidden and weight) at 8192 tokens x H 4096 x V 128256 (Llama-3-8B)
and 4096 x 3584 x 152064 (Qwen2.5-7B), bf16: ``llmk`` (llmk.fused_linear_cross_entropy: the
default chunk, the weight's gradient summed in its dtype), ``llmk chunk N`` (Liger's chunk rule,
and twice the default: the time / memory trade of the chunk), ``llmk fp32 dW``
(weight_grad_dtype=torch.float32: a float32 accumulator), ``llmk unfused`` (llmk.linear then
llmk.cross_entropy), ``torch`` (F.linear then F.cross_entropy on the bf16 logits) and
``liger`` (Liger-Kernel's LigerFusedLinearCrossEntropyLoss, where installed). Columns:
``time_ms`` and ``peak_mib`` (torch.cuda.max_memory_allocated over what is allocated before the
call, so the returned gradients are in it) of forward + backward; ``transient_mib``, that peak
less the bytes of what the call returns (dhidden and dweight, 1066 MiB at Llama-3-8B's head,
and the loss): the memory the implementation needs of its own, which is what a fused op can
save (every implementation returns the same gradients); the time and peak of the forward
alone under torch.no_grad (``fwd_ms``, ``fwd_peak_mib``, nothing returned but the loss); and the
max error of the loss and of each gradient relative to the max of a float32 reference (torch
in float32, TF32 off). Timing: CUDA events around single calls (each is tens of ms), median of
5 after a warm-up. Without a GPU it is skipped with a note."""

import argparse
import csv
import statistics
import sys

import torch
import torch.nn.functional as F

import llmk
from ..views.loss import FLCE, is_fused_linear_cross_entropy_row, markdown_fused_linear_cross_entropy  # noqa: F401

VOCABS = [32000, 128256]
TOKENS = [1, 16, 2048, 8192]


def _grad_of(loss_fn):
    def run(x, target):
        return torch.autograd.grad(loss_fn(x, target), x)

    return run


def _liger():
    try:
        from liger_kernel.transformers.functional import liger_cross_entropy
    except Exception:  # noqa: BLE001 - not installed (or incompatible): no Liger row
        return None
    return lambda x, t: liger_cross_entropy(x, t)


def cross_entropy_case(tokens, vocab, dtype, device):
    elt = torch.tensor([], dtype=dtype).element_size()
    impls = {"llmk": _grad_of(llmk.cross_entropy), "torch": _grad_of(F.cross_entropy)}
    if device == "cuda":
        impls["compile"] = _grad_of(torch.compile(F.cross_entropy, dynamic=False))
        liger = _liger()
        if liger is not None:
            impls["liger"] = _grad_of(liger)

    def make():
        # Drawn on the CPU: a peer whose backward cannot be graph-captured (timed with events
        # instead) can leave the CUDA generator mid-capture for the next draw.
        x = (torch.randn(tokens, vocab) * 3).to(device=device, dtype=dtype).requires_grad_()
        return x, torch.randint(0, vocab, (tokens,)).to(device)

    def reference(x, target):
        x64 = x.detach().double().requires_grad_()
        return torch.autograd.grad(F.cross_entropy(x64, target), x64)[0]

    return 3 * tokens * vocab * elt, make, impls, reference


OPS = {"cross_entropy": cross_entropy_case}
SWEEPS = {"cross_entropy": (TOKENS, VOCABS)}
CPU_SWEEPS = {"cross_entropy": ([1, 64], [4096, 32000])}


# --- fused linear + cross-entropy (GPU only, its own rows) -------------------------------------

FLCE_SHAPES = {"llama3_8b": (8192, 4096, 128256), "qwen2.5_7b": (4096, 3584, 152064)}  # tokens, H, V
FLCE_REPEATS = 5


def _first_of(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _flce_impls(tokens, hidden, vocab):
    """name -> (chunk or None, loss_fn(h, w, t))."""
    from llmk.ops.loss import _flce_chunk_size

    default = _flce_chunk_size(tokens, hidden, vocab, True)
    impls = {"llmk": (default, lambda h, w, t: llmk.fused_linear_cross_entropy(h, w, t))}
    for chunk in dict.fromkeys((_flce_chunk_size(tokens, hidden, vocab, False), min(tokens, 2 * default))):
        if chunk != default:
            impls[f"llmk chunk {chunk}"] = (chunk, lambda h, w, t, chunk=chunk: llmk.fused_linear_cross_entropy(
                h, w, t, chunk_size=chunk))
    impls["llmk fp32 dW"] = (_flce_chunk_size(tokens, hidden, vocab, True, 4), lambda h, w, t: (
        llmk.fused_linear_cross_entropy(h, w, t, weight_grad_dtype=torch.float32)))
    impls["llmk unfused"] = (None, lambda h, w, t: llmk.cross_entropy(llmk.linear(h, w), t))
    impls["torch"] = (None, lambda h, w, t: F.cross_entropy(F.linear(h, w), t))
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except Exception:  # noqa: BLE001 - not installed (or incompatible): no Liger row
        return impls
    liger = LigerFusedLinearCrossEntropyLoss()
    impls["liger"] = (None, lambda h, w, t: _first_of(liger(w, h, t)))
    return impls


def _bytes(out) -> int:
    tensors = out if isinstance(out, (tuple, list)) else (out,)
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _peak_and_ms(fn):
    """(peak MiB over what is allocated before, MiB of what fn returns, median ms of FLCE_REPEATS
    calls after a warm-up)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    returned = _bytes(out) / 2**20
    del out
    times = []
    for _ in range(FLCE_REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
        del out
    return peak, returned, statistics.median(times)


def _rel_err(got, ref):
    return f"{(got.double() - ref.double()).abs().max().item() / (ref.double().abs().max().item() or 1.0):.2e}"


def run_fused_linear_cross_entropy(device="cuda", failures=None, shapes=None, dtype=torch.bfloat16):
    """The rows of the fused linear + cross-entropy case (see the module docstring); [] without a GPU."""
    failures = [] if failures is None else failures
    if device != "cuda":
        print(f"{FLCE}: skipped on the CPU (a GPU-only case: peak CUDA memory at 8192 x 128256 logits)", flush=True)
        return []
    return _flce_rows(device, failures, shapes or FLCE_SHAPES, dtype)


def _flce_rows(device, failures, shapes, dtype):
    rows = []
    for name, (tokens, hidden, vocab) in shapes.items():
        # Drawn on the CPU: the sweep before may leave the CUDA generator marked as capturing
        # (torch: "Offset increment outside graph capture").
        gen = torch.Generator().manual_seed(0)
        h = torch.randn(tokens, hidden, generator=gen, dtype=dtype).to(device).requires_grad_()
        w = (torch.randn(vocab, hidden, generator=gen) * (2 * hidden**-0.5)).to(device, dtype).requires_grad_()
        t = torch.randint(0, vocab, (tokens,), generator=gen).to(device)
        allow_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:  # the float32 reference (~16 GB at 8192 x 128256), kept on the GPU for the comparisons
            h32, w32 = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
            ref_loss = F.cross_entropy(F.linear(h32, w32), t)
            ref = (ref_loss.detach(), *torch.autograd.grad(ref_loss, (h32, w32)))
            del h32, w32, ref_loss
        except Exception as e:  # noqa: BLE001
            failures.append(f"{FLCE} {name} reference: {type(e).__name__}: {e}")
            print(f"{FLCE} {name}: {failures[-1]}", flush=True)
            ref = None
        finally:
            torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        for impl, (chunk, loss_fn) in _flce_impls(tokens, hidden, vocab).items():
            def train(loss_fn=loss_fn):
                loss = loss_fn(h, w, t)
                return (loss.detach(), *torch.autograd.grad(loss, (h, w)))

            def infer(loss_fn=loss_fn):
                with torch.no_grad():
                    return loss_fn(h, w, t)

            try:
                got = train()
                errors = [_rel_err(g, r) for g, r in zip(got, ref)] if ref is not None else ["", "", ""]
                del got
                peak, returned, ms = _peak_and_ms(train)
                fwd_peak, _, fwd_ms = _peak_and_ms(infer)
            except Exception as e:  # noqa: BLE001 - an OOM or a peer that does not run: report, go on
                failures.append(f"{FLCE} {name} {impl}: {type(e).__name__}: {e}")
                print(f"{FLCE} {name} {impl}: {failures[-1]}", flush=True)
                torch.cuda.empty_cache()
                continue
            rows.append(dict(op=FLCE, dtype=str(dtype).replace("torch.", ""), shape=name, tokens=tokens,
                             hidden=hidden, vocab=vocab, impl=impl, chunk=chunk or "", time_ms=round(ms, 3),
                             peak_mib=round(peak, 1), transient_mib=round(peak - returned, 1),
                             fwd_ms=round(fwd_ms, 3), fwd_peak_mib=round(fwd_peak, 1),
                             loss_rel_err=errors[0], dhidden_rel_err=errors[1], dweight_rel_err=errors[2],
                             timing="events"))
            print(f"{FLCE} {name} {impl:16s} {ms:9.2f} ms {peak:9.1f} MiB peak {peak - returned:9.1f} MiB "
                  f"transient  (forward {fwd_ms:.2f} ms {fwd_peak:.1f} MiB)", flush=True)
        del h, w, t, ref
        torch.cuda.empty_cache()
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m llmk_bench.suites.loss",
                                     description="the fused linear + cross-entropy case (GPU only)")
    parser.add_argument("--csv", help="write the rows here")
    parser.add_argument("--table", help="write the markdown table here")
    parser.add_argument("--shapes", nargs="+", choices=sorted(FLCE_SHAPES), help="default: all")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and llmk._C.cuda_device_count() > 0 else "cpu"
    failures = []
    shapes = {k: FLCE_SHAPES[k] for k in args.shapes} if args.shapes else None
    rows = run_fused_linear_cross_entropy(device, failures, shapes)
    if args.csv and rows:
        with open(args.csv, "w", newline="") as f:
            f.write(f"# llmk benchmark; {FLCE}; {torch.cuda.get_device_name()}\n")
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    table = "\n".join(markdown_fused_linear_cross_entropy(rows)) + "\n" if rows else ""
    print(table)
    if args.table and table:
        with open(args.table, "w") as f:
            f.write(table)
    if failures:
        print(f"{len(failures)} case(s) did not run:\n  " + "\n  ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
