"""Benchmark cases of the gated activations and bias_gelu and their peers, all bf16: eager
PyTorch (``F.silu(gate) * up`` on the halves of x, as Hugging Face's LlamaMLP;
``F.gelu(x + b, approximate="tanh")`` as GPT-2's MLP) and torch.compile of it (per shape,
dynamic=False); the backward peers are autograd through each. Liger-Kernel (``liger``, where
it imports: liger_peers.py) for the gated forms and their backwards. `hidden` is the MLP's
intermediate size d (x is [tokens, 2d] for the gated forms). Each case is
case(tokens, d, dtype, device) -> (bytes moved, make, impls, reference)."""

import torch
import torch.nn.functional as F

import llmk
from .. import liger_peers

FFN = [4864, 14336]  # Qwen2-0.5B, Llama-3-8B intermediate sizes
TOKENS = [1, 16, 2048, 8192]


def _compiled(fn):
    return torch.compile(fn, dynamic=False)


def eager_silu_and_mul(x):
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def eager_gelu_tanh_and_mul(x):
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def eager_swiglu(gate, up):
    return F.silu(gate) * up


def grad_peer(forward):
    """The backward of `forward` alone: its graph is built once per input set, the timed
    call is autograd.grad through it. The last input is dy."""
    graphs = {}

    def run(*args):
        *inputs, dy = args
        key = tuple(t.data_ptr() for t in inputs)
        if key not in graphs:
            leaves = [t.detach().requires_grad_() for t in inputs]
            graphs[key] = (forward(*leaves), leaves)
        y, leaves = graphs[key]
        return torch.autograd.grad(y, leaves, dy, retain_graph=True)

    return run


def randn_maker(dtype, device, *shapes):
    """An input-set maker: fresh normal tensors of `shapes`."""
    return lambda: tuple(torch.randn(*shape, device=device, dtype=dtype) for shape in shapes)


def gated_case(eager, ours, reference, liger):
    def case(tokens, d, dtype, device):
        elt = torch.tensor([], dtype=dtype).element_size()
        impls = liger_peers.add({"llmk": ours, "eager": eager, "compile": _compiled(eager)}, "liger", liger())
        return 3 * tokens * d * elt, randn_maker(dtype, device, (tokens, 2 * d)), impls, reference

    return case


def silu_and_mul_reference(x):
    return eager_silu_and_mul(x.double())


def gelu_tanh_and_mul_reference(x):
    return eager_gelu_tanh_and_mul(x.double())


def silu_and_mul_backward_case(tokens, d, dtype, device):
    elt = torch.tensor([], dtype=dtype).element_size()
    impls = {
        "llmk": lambda x, dy: llmk.silu_and_mul_backward(dy, x),
        "eager": grad_peer(eager_silu_and_mul),
        "compile": grad_peer(_compiled(eager_silu_and_mul)),
    }
    liger = liger_peers.silu_and_mul()
    liger_peers.add(impls, "liger", liger and grad_peer(liger))

    def reference(x, dy):
        x64 = x.double().requires_grad_()
        return torch.autograd.grad(eager_silu_and_mul(x64), x64, dy.double())[0]

    return 5 * tokens * d * elt, randn_maker(dtype, device, (tokens, 2 * d), (tokens, d)), impls, reference


def swiglu_case(tokens, d, dtype, device):
    elt = torch.tensor([], dtype=dtype).element_size()
    impls = {"llmk": llmk.swiglu, "eager": eager_swiglu, "compile": _compiled(eager_swiglu)}
    liger_peers.add(impls, "liger", liger_peers.swiglu())
    return 3 * tokens * d * elt, randn_maker(dtype, device, (tokens, d), (tokens, d)), impls, \
        lambda g, u: eager_swiglu(g.double(), u.double())


def swiglu_backward_case(tokens, d, dtype, device):
    elt = torch.tensor([], dtype=dtype).element_size()
    impls = {
        "llmk": lambda g, u, dy: llmk.swiglu_backward(dy, g, u),
        "eager": grad_peer(eager_swiglu),
        "compile": grad_peer(_compiled(eager_swiglu)),
    }
    liger = liger_peers.swiglu()
    liger_peers.add(impls, "liger", liger and grad_peer(liger))

    def reference(g, u, dy):
        g64 = g.double().requires_grad_()
        return torch.autograd.grad(eager_swiglu(g64, u.double()), g64, dy.double())[0]

    return 5 * tokens * d * elt, randn_maker(dtype, device, (tokens, d), (tokens, d), (tokens, d)), impls, reference


def eager_bias_gelu(x, b):
    """GPT-2's MLP activation after the first projection's bias (tanh form), eager."""
    return F.gelu(x + b, approximate="tanh")


def bias_gelu_case(tokens, d, dtype, device):
    elt = torch.tensor([], dtype=dtype).element_size()
    impls = {"llmk": lambda x, b: llmk.bias_gelu(x, b, "tanh"), "eager": eager_bias_gelu,
             "compile": _compiled(eager_bias_gelu)}
    return 2 * tokens * d * elt, randn_maker(dtype, device, (tokens, d), (d,)), impls, \
        lambda x, b: eager_bias_gelu(x.double(), b.double())


def bias_gelu_backward_case(tokens, d, dtype, device):
    elt = torch.tensor([], dtype=dtype).element_size()
    impls = {
        "llmk": lambda x, b, dy: llmk.bias_gelu_backward(dy, x, b, "tanh"),
        "eager": grad_peer(eager_bias_gelu),
        "compile": grad_peer(_compiled(eager_bias_gelu)),
    }

    def reference(x, b, dy):
        x64 = x.double().requires_grad_()
        return torch.autograd.grad(eager_bias_gelu(x64, b.double()), x64, dy.double())[0]

    return 3 * tokens * d * elt, randn_maker(dtype, device, (tokens, d), (d,), (tokens, d)), impls, reference


OPS = {
    "silu_and_mul": gated_case(eager_silu_and_mul, llmk.silu_and_mul, silu_and_mul_reference,
                               liger_peers.silu_and_mul),
    "gelu_and_mul": gated_case(eager_gelu_tanh_and_mul, lambda x: llmk.gelu_and_mul(x, "tanh"),
                               gelu_tanh_and_mul_reference, liger_peers.gelu_tanh_and_mul),
    "silu_and_mul_backward": silu_and_mul_backward_case,
    "swiglu": swiglu_case,
    "swiglu_backward": swiglu_backward_case,
    "bias_gelu": bias_gelu_case,
    "bias_gelu_backward": bias_gelu_backward_case,
}
SWEEPS = {op: (TOKENS, FFN) for op in OPS}
SWEEPS["bias_gelu"] = SWEEPS["bias_gelu_backward"] = (TOKENS, [3072, 16384])  # GPT-2 small, GPT-J
CPU_SWEEPS = {op: ([1, 64], [4864]) for op in OPS}  # without a GPU: the CPU backend at small shapes
CPU_SWEEPS["bias_gelu"] = CPU_SWEEPS["bias_gelu_backward"] = ([1, 64], [3072])
