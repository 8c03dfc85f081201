"""Benchmark case of a chain of 8 llmk kernels at decode sizes (`chain8`): the
memory-bound steps of a decoder layer, one kernel each (rmsnorm, silu_and_mul, add_rmsnorm,
softmax, twice over), on [tokens, hidden] bf16 rows. At 1-16 tokens each kernel's own work is
shorter than a launch, so the chain's time is what programmatic dependent launch (common/
pdl_launch.h: each kernel's launch and prologue overlapping the previous one's tail) buys.
Peers: the same chain in eager PyTorch and under torch.compile, and the yardstick `empty8`,
8 empty kernels (torch.cuda._sleep(0)) in the same CUDA graph timing. Each case is
case(tokens, hidden, dtype, device) -> (bytes moved, make, impls, reference)."""

import torch
import torch.nn.functional as F

import llmk

EPS = 1e-6


def llmk_chain(x, gate_up, weight):
    h = llmk.rmsnorm(x, weight, EPS)
    a = llmk.silu_and_mul(gate_up)
    h, _ = llmk.add_rmsnorm(h, a, weight, EPS)
    h = llmk.rmsnorm(llmk.softmax(h), weight, EPS)
    a = llmk.silu_and_mul(gate_up)
    h, _ = llmk.add_rmsnorm(a, h, weight, EPS)
    return llmk.softmax(h)


def eager_chain(x, gate_up, weight):
    def rmsnorm(t):
        return F.rms_norm(t, (t.shape[-1],), weight, EPS)

    def silu_and_mul(t):
        gate, up = t.chunk(2, dim=-1)
        return F.silu(gate) * up

    def softmax(t):
        return torch.softmax(t.float(), -1).to(t.dtype)

    h = rmsnorm(x)
    a = silu_and_mul(gate_up)
    h = rmsnorm(h + a)
    h = rmsnorm(softmax(h))
    a = silu_and_mul(gate_up)
    return softmax(rmsnorm(a + h))


def empty8(*args):
    for _ in range(8):
        torch.cuda._sleep(0)
    return args[0]


empty8.note = "8 empty kernels: the yardstick (its error column is meaningless)"


def chain8_case(tokens, hidden, dtype, device):
    elt = torch.tensor([], dtype=dtype).element_size()

    def make():
        return (torch.randn(tokens, hidden, device=device, dtype=dtype),
                torch.randn(tokens, 2 * hidden, device=device, dtype=dtype),
                1 + 0.1 * torch.randn(hidden, device=device, dtype=dtype))

    impls = {"llmk": llmk_chain, "eager": eager_chain, "compile": torch.compile(eager_chain, dynamic=False)}
    if device == "cuda":
        impls["empty8"] = empty8

    def reference(x, gate_up, weight):
        return eager_chain(x.double(), gate_up.double(), weight.double())

    # Each kernel reads and writes its rows once: 18 passes over [tokens, hidden] in all (the
    # silu_and_mul inputs counting twice).
    return 18 * tokens * hidden * elt, make, impls, reference


OPS = {"chain8": chain8_case}
SWEEPS = {"chain8": ([1, 16], [4096])}
CPU_SWEEPS = {"chain8": ([1, 16], [4096])}
