"""Benchmark cases of the fused AdamW step: llmk.optim.AdamW against torch.optim.AdamW with
foreach=True and with fused=True (both capturable=True, so that every optimizer is timed
inside a CUDA graph: kernel time, no Python). Rows reuse the table's columns: `tokens` is
the number of parameter tensors, `hidden` the total parameters in millions, split evenly.
Bytes per parameter: read p, g, m, v and write p, m, v = 28 with fp32 parameters; 22 with
bf16 ones (llmk keeps fp32 moments; torch keeps bf16 moments, 14 bytes, so its GB/s column
is overstated by 22/14 in the bf16 rows). On the CPU torch's optimizers run with
capturable=False (capturable needs a GPU)."""

import torch

import llmk

TENSORS = [16, 256]
MILLIONS = [10, 100]
LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01


def optimizers(capturable=True):
    """name -> a builder of the optimizer over a parameter list (torch's capturable on the GPU only)."""
    def torch_adamw(**kind):
        return lambda params: torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                                                capturable=capturable, **kind)

    return {
        "llmk": lambda params: llmk.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY),
        "foreach": torch_adamw(foreach=True),
        "fused": torch_adamw(fused=True),
    }


def adamw_case(dtype_override=None):
    def case(tensors, millions, dtype, device):
        dtype = dtype_override or torch.float32
        tensors_count = tensors
        total = millions * 1_000_000 // tensors * tensors
        size = total // tensors
        bytes_per = 28 if dtype == torch.float32 else 22

        def make():  # each parameter and gradient its own allocation, as in a model
            params = [torch.randn(size, device=device, dtype=dtype) for _ in range(tensors)]
            return (*params, *[torch.randn_like(p) * 1e-2 for p in params])

        def impl(build):
            optimizers = {}

            def step(*tensors):
                key = tensors[0].data_ptr()
                if key not in optimizers:  # first call of a buffer set: state created outside the capture
                    params = list(tensors[:tensors_count])
                    for p, g in zip(params, tensors[tensors_count:]):
                        p.grad = g
                    optimizers[key] = build(params)
                optimizers[key].step()
                return tensors[0]

            return step

        def reference(*tensors):  # the first tensor after one step from zero state, float64
            p, g = tensors[0].double(), tensors[tensors_count].double()
            m, v = (1 - BETAS[0]) * g, (1 - BETAS[1]) * g * g
            update = LR / (1 - BETAS[0]) * m / ((v / (1 - BETAS[1])).sqrt() + EPS)
            return p * (1 - LR * WEIGHT_DECAY) - update

        return bytes_per * total, make, {name: impl(b) for name, b in optimizers(device == "cuda").items()}, reference

    return case


OPS = {
    "adamw": adamw_case(),
    "adamw_bf16": adamw_case(torch.bfloat16),
}
SWEEPS = {op: (TENSORS, MILLIONS) for op in OPS}
CPU_SWEEPS = {op: ([4, 16], [1]) for op in OPS}  # without a GPU: the CPU backend, 1M parameters
