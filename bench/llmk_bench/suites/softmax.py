"""Benchmark cases of the softmax family and their peers, all bf16: torch.softmax /
torch.log_softmax (PyTorch's fused kernels) and torch.compile of them (per shape,
dynamic=False); the backward peers are autograd through each; Liger-Kernel's softmax
(``liger``, where it imports: liger_peers.py) forward and backward. `hidden` is the row
length n: attention-score rows (4096) and vocabulary rows (Llama-2 32000, Llama-3 128256).
Each case is case(tokens, n, dtype, device) -> (bytes moved, make, impls, reference)."""

import torch

import llmk
from .. import liger_peers
from .activation import grad_peer

COLUMNS = [4096, 32000, 128256]
TOKENS = [1, 16, 2048, 8192]


def _randn(tokens, n, dtype, device):
    return torch.randn(tokens, n, device=device, dtype=dtype) * 3


def _torch_softmax(x):
    return torch.softmax(x, -1)


def _torch_log_softmax(x):
    return torch.log_softmax(x, -1)


def forward_case(log):
    peer = _torch_log_softmax if log else _torch_softmax

    def case(tokens, n, dtype, device):
        elt = torch.tensor([], dtype=dtype).element_size()
        impls = {"llmk": llmk.log_softmax if log else llmk.softmax, "torch": peer,
                 "compile": torch.compile(peer, dynamic=False)}
        if not log:
            liger_peers.add(impls, "liger", liger_peers.softmax())
        return 2 * tokens * n * elt, lambda: (_randn(tokens, n, dtype, device),), impls, lambda x: peer(x.double())

    return case


def softmax_backward_case(tokens, n, dtype, device):
    elt = torch.tensor([], dtype=dtype).element_size()
    # The peers run autograd.grad through a graph built once per input set (from x); llmk
    # takes the forward's output y directly.
    eager_peer = grad_peer(_torch_softmax)
    compile_peer = grad_peer(torch.compile(_torch_softmax, dynamic=False))
    impls = {
        "llmk": lambda x, y, dy: llmk.softmax_backward(dy, y),
        "torch": lambda x, y, dy: eager_peer(x, dy),
        "compile": lambda x, y, dy: compile_peer(x, dy),
    }
    liger = liger_peers.softmax()
    if liger is not None:
        liger_peer = grad_peer(liger)
        impls["liger"] = lambda x, y, dy: liger_peer(x, dy)

    def make():
        x = _randn(tokens, n, dtype, device)
        return x, torch.softmax(x, -1), torch.randn(tokens, n, device=device, dtype=dtype)

    def reference(x, y, dy):
        y64 = y.double()
        return y64 * (dy.double() - (dy.double() * y64).sum(-1, keepdim=True))

    return 3 * tokens * n * elt, make, impls, reference


OPS = {
    "softmax": forward_case(False),
    "log_softmax": forward_case(True),
    "softmax_backward": softmax_backward_case,
}
SWEEPS = {op: (TOKENS, COLUMNS) for op in OPS}
CPU_SWEEPS = {op: ([1, 64], [4096, 32000]) for op in OPS}  # without a GPU: the CPU backend at small shapes
