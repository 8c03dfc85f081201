"""The op table (python/llmk/ops): every torch.ops.llmk op has its C++ kernels registered for
CPU and CUDA, passes torch.library.opcheck (schema, fake tensors against the real kernel,
autograd registration, AOT dispatch with dynamic shapes) and runs under
torch.compile(fullgraph=True); the public API is exactly the table's; every op has a sample
here, so a new op without one fails."""

import inspect

import pytest
import torch

import llmk
from llmk.ops import OPS, PUBLIC


def _rows(*shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def _adamw_args():
    p = [torch.randn(5, 8), torch.randn(3)]
    return ([t.clone() for t in p], [torch.randn_like(t) for t in p], [torch.zeros_like(t) for t in p],
            [torch.zeros_like(t) for t in p], [torch.ones(()) for _ in p], 1e-3, None, 0.9, 0.999, 1e-8, 0.01, False)


def _rope_args(grad=False):
    q, k = _rows(2, 5, 4, 16, grad=grad), _rows(2, 5, 2, 16, grad=grad)
    return (q, k, torch.arange(5), None, 10000.0, 0, "neox", [8.0, 1.0, 4.0, 8192.0])


def _qkv(grad=False):
    return (_rows(1, 9, 4, 32, dtype=torch.bfloat16, grad=grad), _rows(1, 7, 2, 32, dtype=torch.bfloat16, grad=grad),
            _rows(1, 7, 2, 32, dtype=torch.bfloat16, grad=grad))


def _varlen(grad=True):
    q, k, v = (_rows(12, h, 32, dtype=torch.float16, grad=grad) for h in (4, 2, 2))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    return (q, k, v, cu, cu, 7, 7, True, 0.2, True)


def _attention_backward():
    q, k, v = _qkv()
    out, lse = llmk.attention(q, k, v, causal=True, scale=0.125, return_lse=True)
    return (torch.randn_like(out), q, k, v, out, lse, True, 0.125, False)


def _attention_varlen_backward():
    q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, _ = _varlen(grad=False)
    out, lse = llmk.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, return_lse=True)
    return (torch.randn_like(out), q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, scale, True)


def _decode():
    """Paged bf16 cache (pages in any order), append with GPT-J rotary, lse: every argument used."""
    q = _rows(2, 2, 4, 64, dtype=torch.bfloat16)
    k_cache, v_cache = _rows(5, 4, 2, 64, dtype=torch.bfloat16), _rows(5, 4, 2, 64, dtype=torch.bfloat16)
    table = torch.tensor([[3, 0], [1, 4]], dtype=torch.int32)
    new = _rows(2, 2, 4, 64, dtype=torch.bfloat16)
    return (q, k_cache, v_cache, torch.tensor([3, 5], dtype=torch.int32), table, new[:, :, :2], new[:, :, 2:],
            llmk.rope_cos_sin_cache(16, 32), True, True, 0.2, True, None, None)


def _quantized(k, n):
    """(packed, scales, zeros, bits, group_size) of a random int4 group-128 weight [n, k]."""
    packed, scales, zeros = llmk.quantize_weight(_rows(n, k, dtype=torch.bfloat16), 4, 128, symmetric=False)
    return (packed, scales, zeros, 4, 128)


def _one_rank_group():
    return llmk._C.register_peer_group(0, 1, 16, [])


# One sample per op: the arguments of a CPU call (tensors that should train require grad).
SAMPLES = {
    "rmsnorm": lambda: (_rows(5, 64, grad=True), _rows(64, grad=True), 1e-6, 0.0),
    "rmsnorm_with_rstd": lambda: (_rows(2, 5, 64, grad=True), _rows(64, grad=True), 1e-6, 1.0),
    "rmsnorm_backward": lambda: (_rows(5, 64), _rows(5, 64), _rows(64), 1e-6, 0.0, _rows(5, 64)),
    "add_rmsnorm": lambda: (_rows(5, 64, grad=True), _rows(5, 64, grad=True), _rows(64, grad=True), 1e-6, 0.0),
    "add_rmsnorm_": lambda: (_rows(5, 64), _rows(5, 64), _rows(64), 1e-6, 0.0),
    "rmsnorm_swiglu": lambda: (_rows(5, 64, grad=True), _rows(5, 64, grad=True), _rows(64, grad=True), 1e-6, 0.0),
    "rmsnorm_swiglu_backward": lambda: (_rows(5, 64), _rows(5, 64), _rows(5, 64), _rows(64), 1e-6, 0.0),
    "layernorm": lambda: (_rows(5, 64, grad=True), _rows(64, grad=True), _rows(64, grad=True), 1e-5),
    "layernorm_with_stats": lambda: (_rows(2, 5, 64, grad=True), _rows(64, grad=True), _rows(64, grad=True), 1e-5),
    "layernorm_backward": lambda: (_rows(5, 64), _rows(5, 64), _rows(64), 1e-5, True, _rows(5), _rows(5).abs() + 0.5),
    "silu_and_mul": lambda: (_rows(3, 5, 64, grad=True),),
    "gelu_and_mul": lambda: (_rows(5, 64, grad=True), "tanh"),
    "silu_and_mul_backward": lambda: (_rows(5, 32), _rows(5, 64)),
    "gelu_and_mul_backward": lambda: (_rows(5, 32), _rows(5, 64), "none"),
    "swiglu": lambda: (_rows(5, 32, grad=True), _rows(5, 32, grad=True)),
    "swiglu_backward": lambda: (_rows(5, 32), _rows(5, 32), _rows(5, 32)),
    "geglu": lambda: (_rows(5, 32, grad=True), _rows(5, 32, grad=True), "tanh"),
    "geglu_backward": lambda: (_rows(5, 32), _rows(5, 32), _rows(5, 32), "none"),
    "bias_gelu": lambda: (_rows(5, 64, grad=True), _rows(64, grad=True), "none"),
    "bias_gelu_backward": lambda: (_rows(5, 64), _rows(5, 64), _rows(64), "tanh"),
    "softmax": lambda: (_rows(5, 100, grad=True), 0.5),
    "log_softmax": lambda: (_rows(5, 100, grad=True), 2.0),
    "softmax_backward": lambda: (_rows(5, 100), torch.softmax(_rows(5, 100), -1), 0.5),
    "log_softmax_backward": lambda: (_rows(5, 100), torch.log_softmax(_rows(5, 100), -1), 1.0),
    "rope_": lambda: _rope_args(),
    "rope_backward_": lambda: _rope_args(),
    "rope": lambda: _rope_args(grad=True),
    "rope_backward": lambda: _rope_args(),
    "adamw_step_": _adamw_args,
    "cross_entropy": lambda: (_rows(6, 37, grad=True), torch.tensor([0, 5, -100, 36, 2, 9]), -100, 0.1, 1e-4),
    "cross_entropy_grad_": lambda: (_rows(6, 37), torch.tensor([0, 5, -100, 36, 2, 9]), -100, 0.1, 1e-4),
    "cross_entropy_backward": lambda: (_rows(6), _rows(6, 37), torch.tensor([0, 5, -100, 36, 2, 9]),
                                       torch.logsumexp(_rows(6, 37), -1), -100, 0.1, 1e-4),
    "linear": lambda: (_rows(5, 64, dtype=torch.bfloat16, grad=True), _rows(48, 64, dtype=torch.bfloat16, grad=True),
                       _rows(48, dtype=torch.bfloat16, grad=True), _rows(5, 24, dtype=torch.bfloat16, grad=True),
                       "silu_mul"),
    "rmsnorm_linear": lambda: (_rows(2, 3, 64, dtype=torch.bfloat16, grad=True), _rows(64, grad=True),
                               _rows(32, 64, dtype=torch.bfloat16, grad=True), 1e-6),
    "quantized_linear": lambda: (_rows(3, 256, dtype=torch.bfloat16, grad=True), *_quantized(256, 24),
                                 _rows(24, dtype=torch.bfloat16, grad=True)),
    "dequantize_weight": lambda: _quantized(256, 24),
    "quantize_weight_": lambda: (_rows(24, 256), torch.zeros(24, 256 * 4 // 32, dtype=torch.int32),
                                 torch.zeros(24, 2, dtype=torch.bfloat16), torch.zeros(24, 2, dtype=torch.uint8), 4, 128),
    "pack_quantized_weight": lambda: (torch.randint(0, 256, (8, 128), dtype=torch.uint8), 8),
    "attention": lambda: (*_qkv(grad=True), True, 0.125, True),
    "attention_varlen": _varlen,
    "attention_backward": _attention_backward,
    "attention_varlen_backward": _attention_varlen_backward,
    "attention_decode": _decode,
    # a peer group of one rank (no buffers: add_rmsnorm_, which runs on the CPU too)
    "all_reduce_add_rmsnorm_": lambda: (_rows(5, 64), _rows(5, 64), _rows(64), 1e-6, 0.0, _one_rank_group()),
}


INFERENCE_ONLY = {"attention_decode"}


def test_every_op_has_a_sample():
    assert sorted(SAMPLES) == sorted(OPS)


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("key", ["CPU", "CUDA"])
def test_kernel_registered(name, key):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"llmk::{name}", key), f"llmk::{name} has no {key} kernel"


@pytest.mark.parametrize("name", sorted(OPS))
def test_opcheck(name):
    # attention_decode is inference-only: its autograd kernel raises on backward, which
    # opcheck's autograd test would reach.
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic") if name in INFERENCE_ONLY else \
        ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(OPS[name], SAMPLES[name](), test_utils=utils)


def _fresh(args):
    return [[t.clone() if torch.is_tensor(t) else t for t in a] if isinstance(a, list) else
            a.detach().clone().requires_grad_(a.requires_grad) if torch.is_tensor(a) else a for a in args]


def _loss(outputs):
    """A scalar of every differentiable output (None when there is none)."""
    outs = [o for o in torch.utils._pytree.tree_leaves(outputs) if torch.is_tensor(o) and o.requires_grad]
    return sum((o.float() * torch.linspace(-1, 1, o.numel()).view(o.shape)).sum() for o in outs) if outs else None


@pytest.mark.parametrize("name", sorted(OPS))
def test_compile_fullgraph_matches_eager(name):
    """Forward and, where the op trains, backward under torch.compile(fullgraph=True)."""
    args = SAMPLES[name]()
    fresh = _fresh(args)
    op = OPS[name]
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: op(*a), backend="aot_eager", fullgraph=True, dynamic=False)
    got, want = compiled(*args), op(*fresh)
    for g, w in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        torch.testing.assert_close(g, w, equal_nan=True)
    loss_got, loss_want = _loss(got), _loss(want)
    if loss_got is not None and name not in INFERENCE_ONLY:
        loss_got.backward()
        loss_want.backward()
    for a, f in zip(args, fresh):  # mutated inputs and gradients agree too
        if torch.is_tensor(a):
            torch.testing.assert_close(a.detach(), f.detach(), equal_nan=True)
            if a.requires_grad and a.grad is not None:
                torch.testing.assert_close(a.grad, f.grad)


def test_public_api_is_the_table():
    assert set(llmk.__all__) == set(PUBLIC) | {"distributed", "nn", "optim", "quantization", "patch", "unpatch", "PatchReport",
                                               "device_info", "attention_head_dims"}
    for name, fn in PUBLIC.items():
        assert getattr(llmk, name) is fn
        assert fn.__doc__, f"llmk.{name} has no docstring"


@pytest.mark.parametrize("name", sorted(n for n in PUBLIC if hasattr(PUBLIC[n], "op")))
def test_generated_wrapper_has_the_schema_signature(name):
    params = list(inspect.signature(PUBLIC[name]).parameters)
    assert params == [a.name for a in OPS[name]._schema.arguments]


def test_activation_names_are_the_cpp_tables():
    """Python's activation table (ops/activation.py) and the C++ op layer's parser
    (python/src/torch_bridge.cc) name the same strings in the same order."""
    from llmk import _C
    from llmk.ops.activation import GELU_APPROXIMATIONS, LINEAR_ACTIVATIONS
    assert LINEAR_ACTIVATIONS == tuple(_C.gemm_activation_names())
    assert GELU_APPROXIMATIONS == tuple(_C.gelu_approximation_names())
