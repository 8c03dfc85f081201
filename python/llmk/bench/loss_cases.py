"""Benchmark cases of the loss family, bf16 logits: cross_entropy forward + backward
(reduction "mean", the gradient of the logits) against F.cross_entropy through autograd, its
torch.compile, and Liger-Kernel's cross-entropy where it is installed. `hidden` is the vocabulary
(Llama-2 32000, Llama-3 128256). Bytes: the ideal fwd+bwd, read the logits twice and write
their gradient once. Each case is case(tokens, vocab, dtype, device) -> (bytes moved, make,
impls, reference)."""

import torch
import torch.nn.functional as F

import llmk

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
