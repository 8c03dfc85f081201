"""Benchmark cases of the normalization family and their peers, all bf16.

RMSNorm peers, measured in the same run: the Hugging Face Llama formula in eager PyTorch,
F.rms_norm (PyTorch's fused op), and torch.compile of the eager formula (compiled per
shape, dynamic=False); the backward peers are autograd through F.rms_norm and through the
compiled formula. LayerNorm peers: F.layer_norm (PyTorch's fused kernel) and torch.compile
of it, forward and backward. Gated RMSNorm (rmsnorm_swiglu) peers: llmk's own two-kernel
composition (rmsnorm, then swiglu), Qwen3-Next's eager RMSNormGated and torch.compile of it.
Liger-Kernel (``liger``, where it imports: liger_peers.py) for rmsnorm, add_rmsnorm,
layernorm, their backwards and layernorm_train (forward + backward through autograd, as a
training step runs them).
Each case is case(tokens, hidden, dtype, device) -> (bytes moved, make, impls, reference).
"""

import torch
import torch.nn.functional as F

import llmk
from .. import liger_peers

HIDDEN = [896, 2048, 4096, 5120, 8192, 16384]  # Qwen2-0.5B .. Llama-3-405B
TOKENS = [1, 16, 128, 2048, 8192, 32768]
EPS = 1e-6


def hf_rmsnorm(x, w):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return w * h.to(x.dtype)


def hf_add_rmsnorm(x, r, w):
    s = x + r
    return hf_rmsnorm(s, w), s


def _compiled(fn):
    return torch.compile(fn, dynamic=False)


def autograd_peer(forward, with_bias=False):
    """The backward of `forward` alone: the forward graph is built once per input set (x, w,
    and a zero bias when `with_bias`), the timed call is autograd.grad through it."""
    graphs = {}

    def run(x, w, dy):
        key = (x.data_ptr(), w.data_ptr())
        if key not in graphs:
            params = [x.detach().requires_grad_(), w.detach().requires_grad_()]
            if with_bias:
                params.append(torch.zeros_like(w, requires_grad=True))
            graphs[key] = (forward(*params), params)
        y, params = graphs[key]
        return torch.autograd.grad(y, params, dy, retain_graph=True)

    return run


def backward_inputs(tokens, hidden, dtype, device):
    """An input-set maker for the backward cases: (x, weight, dy)."""
    def make():
        return (torch.randn(tokens, hidden, device=device, dtype=dtype),
                torch.randn(hidden, device=device, dtype=dtype),
                torch.randn(tokens, hidden, device=device, dtype=dtype))

    return make


def rmsnorm_case(tokens, hidden, dtype, device):
    elt = torch.tensor([], dtype=dtype).element_size()
    bytes_moved = 2 * tokens * hidden * elt + hidden * elt

    def make():
        return (torch.randn(tokens, hidden, device=device, dtype=dtype),
                torch.randn(hidden, device=device, dtype=dtype))

    impls = {
        "llmk": lambda x, w: llmk.rmsnorm(x, w, EPS),
        "eager": hf_rmsnorm,
        "F.rms_norm": lambda x, w: F.rms_norm(x, (hidden,), w, EPS),
        "compile": _compiled(hf_rmsnorm),
    }
    liger_peers.add(impls, "liger", liger_peers.rms_norm(EPS))

    def reference(x, w):
        x64 = x.double()
        return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * w.double()

    return bytes_moved, make, impls, reference


def add_rmsnorm_case(tokens, hidden, dtype, device, in_place=False):
    elt = torch.tensor([], dtype=dtype).element_size()
    bytes_moved = 4 * tokens * hidden * elt + hidden * elt

    def make():
        return (torch.randn(tokens, hidden, device=device, dtype=dtype),
                torch.randn(tokens, hidden, device=device, dtype=dtype),
                torch.randn(hidden, device=device, dtype=dtype))

    def ours_in_place(x, r, w):
        llmk.add_rmsnorm_(x, r, w, EPS)
        return x, r

    impls = {
        "llmk": ours_in_place if in_place else (lambda x, r, w: llmk.add_rmsnorm(x, r, w, EPS)),
        "eager": hf_add_rmsnorm,
        "compile": _compiled(hf_add_rmsnorm),
    }
    if not in_place:
        liger_peers.add(impls, "liger", liger_peers.fused_add_rms_norm(EPS))

    def reference(x, r, w):
        s = (x + r).double()
        return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * w.double()

    # The in-place form overwrites its inputs: compare on a copy, and rotate buffers so
    # that repeated calls keep finite values (the sum grows by at most the norm each call).
    return bytes_moved, make, impls, reference


def rmsnorm_backward_case(tokens, hidden, dtype, device):
    elt = torch.tensor([], dtype=dtype).element_size()
    bytes_moved = 3 * tokens * hidden * elt + 2 * hidden * elt

    make = backward_inputs(tokens, hidden, dtype, device)

    impls = {
        "llmk": lambda x, w, dy: llmk.rmsnorm_backward(dy, x, w, EPS),
        "F.rms_norm": autograd_peer(lambda x, w: F.rms_norm(x, (hidden,), w, EPS)),
        "compile": autograd_peer(_compiled(hf_rmsnorm)),
    }
    liger = liger_peers.rms_norm(EPS)
    liger_peers.add(impls, "liger", liger and autograd_peer(liger))

    def reference(x, w, dy):
        x64 = x.double().requires_grad_()
        y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * w.double()
        return torch.autograd.grad(y, x64, dy.double())[0]

    return bytes_moved, make, impls, reference


def layernorm_case(tokens, hidden, dtype, device):
    elt = torch.tensor([], dtype=dtype).element_size()
    bytes_moved = 2 * tokens * hidden * elt + 2 * hidden * elt

    def make():
        return (torch.randn(tokens, hidden, device=device, dtype=dtype),
                torch.randn(hidden, device=device, dtype=dtype),
                torch.randn(hidden, device=device, dtype=dtype))

    def torch_layernorm(x, w, b):
        return F.layer_norm(x, (hidden,), w, b, EPS)

    impls = {
        "llmk": lambda x, w, b: llmk.layernorm(x, w, b, EPS),
        "F.layer_norm": torch_layernorm,
        "compile": _compiled(torch_layernorm),
    }
    liger_peers.add(impls, "liger", liger_peers.layer_norm(EPS))

    def reference(x, w, b):
        return F.layer_norm(x.double(), (hidden,), w.double(), b.double(), EPS)

    return bytes_moved, make, impls, reference


def layernorm_backward_case(tokens, hidden, dtype, device):
    elt = torch.tensor([], dtype=dtype).element_size()
    bytes_moved = 3 * tokens * hidden * elt + 3 * hidden * elt

    make = backward_inputs(tokens, hidden, dtype, device)

    def torch_layernorm(x, w, b):
        return F.layer_norm(x, (hidden,), w, b, EPS)

    impls = {
        "llmk": lambda x, w, dy: llmk.layernorm_backward(dy, x, w, EPS),
        "F.layer_norm": autograd_peer(torch_layernorm, with_bias=True),
        "compile": autograd_peer(_compiled(torch_layernorm), with_bias=True),
    }
    liger = liger_peers.layer_norm(EPS)
    liger_peers.add(impls, "liger", liger and autograd_peer(liger, with_bias=True))

    def reference(x, w, dy):
        x64 = x.double().requires_grad_()
        y = F.layer_norm(x64, (hidden,), w.double(), None, EPS)
        return torch.autograd.grad(y, x64, dy.double())[0]

    return bytes_moved, make, impls, reference


def layernorm_train_case(tokens, hidden, dtype, device):
    """Forward and backward through autograd (x, weight and bias need gradients), graph built
    in the timed call, as a training step runs them."""
    elt = torch.tensor([], dtype=dtype).element_size()
    bytes_moved = 5 * tokens * hidden * elt + 5 * hidden * elt  # x, y; x, dy, dx; w, b, dw, db

    def make():
        return (torch.randn(tokens, hidden, device=device, dtype=dtype),
                torch.randn(hidden, device=device, dtype=dtype),
                torch.randn(hidden, device=device, dtype=dtype),
                torch.randn(tokens, hidden, device=device, dtype=dtype))

    def train(forward):
        def run(x, w, b, dy):
            leaves = [t.detach().requires_grad_() for t in (x, w, b)]
            return torch.autograd.grad(forward(*leaves), leaves, dy)

        return run

    def torch_layernorm(x, w, b):
        return F.layer_norm(x, (hidden,), w, b, EPS)

    impls = {
        "llmk": train(lambda x, w, b: llmk.layernorm(x, w, b, EPS)),
        "F.layer_norm": train(torch_layernorm),
        "compile": train(_compiled(torch_layernorm)),
    }
    liger = liger_peers.layer_norm(EPS)
    liger_peers.add(impls, "liger", liger and train(liger))

    def reference(x, w, b, dy):
        x64 = x.double().requires_grad_()
        y = F.layer_norm(x64, (hidden,), w.double(), b.double(), EPS)
        return torch.autograd.grad(y, x64, dy.double())[0]

    return bytes_moved, make, impls, reference


def hf_gated_rmsnorm(x, gate, w):
    """Qwen3-Next's Qwen3NextRMSNormGated forward (norm before gate) in eager PyTorch."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return (w * h.to(x.dtype)) * F.silu(gate.float()).to(x.dtype)


def llmk_two_kernels(x, gate, w):
    """The composition the fused kernel replaces: rmsnorm to memory, then swiglu."""
    return llmk.swiglu(gate, llmk.rmsnorm(x, w, EPS))


def gated_reference(x, gate, w):
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) * w.double() * F.silu(gate.double())


def rmsnorm_swiglu_case(tokens, hidden, dtype, device):
    elt = torch.tensor([], dtype=dtype).element_size()
    bytes_moved = 3 * tokens * hidden * elt + hidden * elt  # read x, gate; write out

    def make():
        return (torch.randn(tokens, hidden, device=device, dtype=dtype),
                torch.randn(tokens, hidden, device=device, dtype=dtype),
                torch.randn(hidden, device=device, dtype=dtype))

    impls = {
        "llmk": lambda x, gate, w: llmk.rmsnorm_swiglu(x, gate, w, EPS),
        "llmk 2 kernels": llmk_two_kernels,
        "eager": hf_gated_rmsnorm,
        "compile": _compiled(hf_gated_rmsnorm),
    }
    return bytes_moved, make, impls, gated_reference


def rmsnorm_swiglu_backward_case(tokens, hidden, dtype, device):
    elt = torch.tensor([], dtype=dtype).element_size()
    bytes_moved = 5 * tokens * hidden * elt + 2 * hidden * elt  # read dy, x, gate; write dx, dgate

    def make():
        return tuple(torch.randn(tokens, hidden, device=device, dtype=dtype) for _ in range(3)) + (
            torch.randn(hidden, device=device, dtype=dtype),)

    def two_kernels(x, gate, dy, w):  # recompute y, swiglu_backward, rmsnorm_backward
        dgate, dy_norm = llmk.swiglu_backward(dy, gate, llmk.rmsnorm(x, w, EPS))
        dx, dw = llmk.rmsnorm_backward(dy_norm, x, w, EPS)
        return dx, dgate, dw

    def autograd(forward):
        graphs = {}

        def run(x, gate, dy, w):
            key = x.data_ptr()
            if key not in graphs:
                leaves = [t.detach().requires_grad_() for t in (x, gate, w)]
                graphs[key] = (forward(*leaves), leaves)
            y, leaves = graphs[key]
            return torch.autograd.grad(y, leaves, dy, retain_graph=True)

        return run

    impls = {
        "llmk": lambda x, gate, dy, w: llmk.rmsnorm_swiglu_backward(dy, x, gate, w, EPS),
        "llmk 2 kernels": two_kernels,
        "eager": autograd(hf_gated_rmsnorm),
        "compile": autograd(_compiled(hf_gated_rmsnorm)),
    }

    def reference(x, gate, dy, w):
        x64 = x.double().requires_grad_()
        return torch.autograd.grad(gated_reference(x64, gate, w), x64, dy.double())[0]

    return bytes_moved, make, impls, reference


OPS = {
    "rmsnorm": rmsnorm_case,
    "add_rmsnorm": add_rmsnorm_case,
    "add_rmsnorm_": lambda t, h, d, device: add_rmsnorm_case(t, h, d, device, in_place=True),
    "rmsnorm_backward": rmsnorm_backward_case,
    "layernorm": layernorm_case,
    "layernorm_backward": layernorm_backward_case,
    "layernorm_train": layernorm_train_case,
    "rmsnorm_swiglu": rmsnorm_swiglu_case,
    "rmsnorm_swiglu_backward": rmsnorm_swiglu_backward_case,
}
SWEEPS = {op: (TOKENS, HIDDEN) for op in OPS}
# Gated RMSNorm runs per head (Qwen3-Next: rows = tokens x heads of 128) or over a wide row.
SWEEPS["rmsnorm_swiglu"] = SWEEPS["rmsnorm_swiglu_backward"] = ([1, 16, 2048, 8192, 65536], [128, 4096])
# Without a GPU: the CPU backend at small shapes.
CPU_SWEEPS = {op: ([1, 64], [896, 4096]) for op in OPS}
CPU_SWEEPS["rmsnorm_swiglu"] = CPU_SWEEPS["rmsnorm_swiglu_backward"] = ([1, 64], [128, 4096])
