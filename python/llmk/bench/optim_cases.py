"""Benchmark cases of the fused AdamW step: llmk.optim.AdamW against torch.optim.AdamW with
foreach=True and with fused=True (both capturable=True, so that every optimizer is timed
inside a CUDA graph: kernel time, no Python). Rows reuse the table's columns: `tokens` is
the number of parameter tensors, `hidden` the total parameters in millions, split evenly.
Bytes per parameter: read p, g, m, v and write p, m, v = 28 with fp32 parameters; 22 with
bf16 ones (llmk keeps fp32 moments; torch keeps bf16 moments, 14 bytes, so its GB/s column
is overstated by 22/14 in the bf16 rows)."""

import torch

import llmk

TENSORS = [16, 256]
MILLIONS = [10, 100]
LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01


def _optimizers():
    return {
        "llmk": lambda params: llmk.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY),
        "foreach": lambda params: torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                                                    foreach=True, capturable=True),
        "fused": lambda params: torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                                                  fused=True, capturable=True),
    }


def adamw_case(dtype_override=None):
    def case(tensors, millions, dtype):
        dtype = dtype_override or torch.float32
        total = millions * 1_000_000 // tensors * tensors
        size = total // tensors
        bytes_per = 28 if dtype == torch.float32 else 22

        def make():  # one flat buffer each for parameters and gradients; the tensors are views
            return (torch.randn(total, device="cuda", dtype=dtype),
                    torch.randn(total, device="cuda", dtype=dtype) * 1e-2)

        def impl(build):
            optimizers = {}

            def step(flat_p, flat_g):
                key = flat_p.data_ptr()
                if key not in optimizers:  # first call of a buffer set: state created outside the capture
                    params = list(flat_p.split(size))
                    for p, g in zip(params, flat_g.split(size)):
                        p.grad = g
                    optimizers[key] = build(params)
                optimizers[key].step()
                return flat_p

            return step

        def reference(flat_p, flat_g):  # the first step from zero state, float64
            g = flat_g.double()
            m, v = (1 - BETAS[0]) * g, (1 - BETAS[1]) * g * g
            update = LR / (1 - BETAS[0]) * m / ((v / (1 - BETAS[1])).sqrt() + EPS)
            return flat_p.double() * (1 - LR * WEIGHT_DECAY) - update

        return bytes_per * total, make, {name: impl(b) for name, b in _optimizers().items()}, reference

    return case


OPS = {
    "adamw": adamw_case(),
    "adamw_bf16": adamw_case(torch.bfloat16),
}
SWEEPS = {op: (TENSORS, MILLIONS) for op in OPS}
