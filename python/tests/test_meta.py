"""Meta tensors: every public llmk op, given meta tensors, either runs its fake (the output
shapes torch.compile traces with, on meta tensors) or raises an llmk error that names the op;
never a data read such as ``Tensor.item() cannot be called on meta tensors``. CPU-only: meta
tensors have no data and no device."""

import pytest
import torch

import llmk
from llmk.ops import PUBLIC


def _t(*shape, dtype=torch.bfloat16, grad=False):
    return torch.empty(*shape, dtype=dtype, device="meta").requires_grad_(grad)


def _i32(*shape):
    return _t(*shape, dtype=torch.int32)


def _i64(*shape):
    return _t(*shape, dtype=torch.int64)


def _f32(*shape):
    return _t(*shape, dtype=torch.float32)


# name -> () -> (args, kwargs, the outputs' shapes): a shape tuple for one tensor, a list for
# several (None for an output that is None), None for an op that returns nothing. Every public
# op has a case, so a new op without one fails test_every_public_op_has_a_case.
X, D = (4, 64), 64
QKV = ((2, 9, 4, 64), (2, 7, 2, 64))
CASES = {
    # activation
    "silu_and_mul": lambda: ((_t(3, 5, 64),), {}, (3, 5, 32)),
    "gelu_and_mul": lambda: ((_t(5, 64), "tanh"), {}, (5, 32)),
    "silu_and_mul_backward": lambda: ((_t(5, 32), _t(5, 64)), {}, (5, 64)),
    "gelu_and_mul_backward": lambda: ((_t(5, 32), _t(5, 64), "none"), {}, (5, 64)),
    "swiglu": lambda: ((_t(5, 32), _t(5, 32)), {}, (5, 32)),
    "swiglu_backward": lambda: ((_t(5, 32), _t(5, 32), _t(5, 32)), {}, [(5, 32), (5, 32)]),
    "geglu": lambda: ((_t(5, 32), _t(5, 32), "tanh"), {}, (5, 32)),
    "geglu_backward": lambda: ((_t(5, 32), _t(5, 32), _t(5, 32), "none"), {}, [(5, 32), (5, 32)]),
    "bias_gelu": lambda: ((_t(5, 64), _t(64), "none"), {}, (5, 64)),
    "bias_gelu_backward": lambda: ((_t(5, 64), _t(5, 64), _t(64), "tanh"), {}, [(5, 64), (64,)]),
    # attention
    "attention": lambda: ((_t(*QKV[0]), _t(*QKV[1]), _t(*QKV[1])), dict(causal=True, return_lse=True),
                          [QKV[0], (2, 4, 9)]),
    "attention_backward": lambda: ((_t(*QKV[0]), _t(*QKV[0]), _t(*QKV[1]), _t(*QKV[1]), _t(*QKV[0]), _f32(2, 4, 9),
                                    True, 0.125, False), {}, [QKV[0], QKV[1], QKV[1]]),
    "attention_varlen": lambda: ((_t(12, 4, 64), _t(12, 2, 64), _t(12, 2, 64), _i32(3), _i32(3), 7, 7),
                                 dict(causal=True, return_lse=True), [(12, 4, 64), (4, 12)]),
    "attention_varlen_backward": lambda: ((_t(12, 4, 64), _t(12, 4, 64), _t(12, 2, 64), _t(12, 2, 64),
                                           _t(12, 4, 64), _f32(4, 12), _i32(3), _i32(3), 7, 7), {},
                                          [(12, 4, 64), (12, 2, 64), (12, 2, 64)]),
    "scaled_dot_product_attention": lambda: ((_t(2, 4, 9, 64), _t(2, 2, 9, 64), _t(2, 2, 9, 64)),
                                             dict(is_causal=True, enable_gqa=True), (2, 4, 9, 64)),
    "attention_decode": lambda: ((_t(2, 1, 4, 64), _t(2, 16, 2, 64), _t(2, 16, 2, 64), _i32(2)),
                                 dict(k_new=_t(2, 1, 2, 64), v_new=_t(2, 1, 2, 64), return_lse=True),
                                 [(2, 1, 4, 64), (2, 4, 1)]),
    # gemm
    "linear": lambda: ((_t(3, 5, 64), _t(48, 64), _t(48), _t(3, 5, 24), "silu_mul"), {}, (3, 5, 24)),
    "rmsnorm_linear": lambda: ((_t(2, 3, 64), _f32(64), _t(32, 64)), {}, (2, 3, 32)),
    # quantized
    "quantized_linear": lambda: ((_t(2, 3, 256), _i32(24, 32), _t(24, 2), None, 4, 128), {}, (2, 3, 24)),
    "dequantize_weight": lambda: ((_i32(24, 32), _t(24, 2), None, 4, 128), {}, (24, 256)),
    "quantize_weight": lambda: ((_t(24, 256),), dict(symmetric=False), [(24, 32), (24, 2), (24, 2)]),
    "pack_quantized_weight": lambda: ((_t(24, 256, dtype=torch.uint8), 8), {}, (24, 64)),
    # loss
    "cross_entropy": lambda: ((_t(2, 3, 37), _i64(2, 3)), dict(reduction="none", return_lse=True),
                              [(2, 3), (2, 3)]),
    "cross_entropy_backward": lambda: ((_f32(6), _t(6, 37), _i64(6), _f32(6)), {}, (6, 37)),
    "fused_linear_cross_entropy": lambda: ((_t(2, 3, 64), _t(40, 64), _i64(2, 3)), {}, ()),
    # norm
    "rmsnorm": lambda: ((_t(*X), _t(D)), dict(return_rstd=True), [X, X[:-1]]),
    "rmsnorm_backward": lambda: ((_t(*X), _t(*X), _t(D)), {}, [X, (D,)]),
    "add_rmsnorm": lambda: ((_t(*X), _t(*X), _t(D)), {}, [X, X]),
    "add_rmsnorm_": lambda: ((_t(*X), _t(*X), _t(D)), {}, None),
    "rmsnorm_swiglu": lambda: ((_t(*X), _t(*X), _t(D)), {}, X),
    "rmsnorm_swiglu_backward": lambda: ((_t(*X), _t(*X), _t(*X), _t(D)), {}, [X, X, (D,)]),
    "layernorm": lambda: ((_t(*X), _t(D), _t(D)), dict(return_stats=True), [X, X[:-1], X[:-1]]),
    "layernorm_backward": lambda: ((_t(*X), _t(*X), _t(D), 1e-5, True, _f32(4), _f32(4)), {}, [X, (D,), (D,)]),
    # rope
    "rope_": lambda: ((_t(2, 5, 4, 16), _t(2, 5, 2, 16), _i64(5)), dict(theta=10000.0), None),
    "rope_backward_": lambda: ((_t(2, 5, 4, 16), _t(2, 5, 2, 16), _i64(5), _f32(32, 16)), {}, None),
    "rope": lambda: ((_t(2, 5, 4, 16), _t(2, 5, 2, 16), _i64(5)), dict(rot_dim=8), [(2, 5, 4, 16), (2, 5, 2, 16)]),
    "rope_backward": lambda: ((_t(2, 5, 4, 16), None, _i64(5), _f32(32, 16)), {}, [(2, 5, 4, 16), None]),
    "rope_cos_sin_cache": lambda: ((16, 32), dict(device="meta"), (16, 32)),
    # softmax
    "softmax": lambda: ((_f32(4, 100), 0.5), {}, (4, 100)),
    "log_softmax": lambda: ((_f32(4, 100), 2.0), {}, (4, 100)),
    "softmax_backward": lambda: ((_f32(4, 100), _f32(4, 100), 0.5), {}, (4, 100)),
    "log_softmax_backward": lambda: ((_f32(4, 100), _f32(4, 100), 1.0), {}, (4, 100)),
}


def _assert_meta(name, got, want):
    if want is None:
        assert got is None, f"llmk.{name}: expected None, got {type(got).__name__}"
    elif isinstance(want, list):
        assert isinstance(got, (tuple, list)) and len(got) == len(want), f"llmk.{name}: expected {len(want)} outputs"
        for g, w in zip(got, want):
            _assert_meta(name, g, w)
    else:
        assert isinstance(got, torch.Tensor), f"llmk.{name}: expected a tensor, got {type(got).__name__}"
        assert got.device.type == "meta", f"llmk.{name}: output on {got.device}, expected meta"
        assert tuple(got.shape) == tuple(want), f"llmk.{name}: output shape {tuple(got.shape)}, expected {want}"


def test_every_public_op_has_a_case():
    assert sorted(CASES) == sorted(PUBLIC)


@pytest.mark.parametrize("name", sorted(CASES))
def test_meta_tensors_run_the_fake_or_name_the_op(name):
    args, kwargs, want = CASES[name]()
    try:
        got = PUBLIC[name](*args, **kwargs)
    except (RuntimeError, ValueError) as e:
        assert str(e).startswith((f"{name}:", f"llmk.{name}:")), f"llmk.{name} on meta tensors: {e}"
        return
    _assert_meta(name, got, want)


def test_meta_autograd():
    """The backward formulas run on meta tensors too (the fakes of the backward ops)."""
    x, w = _t(4, 64, grad=True), _t(64, grad=True)
    dx, dw = torch.autograd.grad(llmk.rmsnorm(x, w).sum(), (x, w))
    assert dx.shape == x.shape and dw.shape == w.shape and dx.is_meta
    x, weight = _t(5, 64, grad=True), _t(48, 64, grad=True)
    dx, dweight = torch.autograd.grad(llmk.linear(x, weight, None, None, "silu_mul").sum(), (x, weight))
    assert dx.shape == x.shape and dweight.shape == weight.shape and dx.is_meta
    q, k, v = _t(*QKV[0], grad=True), _t(*QKV[1], grad=True), _t(*QKV[1], grad=True)
    grads = torch.autograd.grad(llmk.attention(q, k, v, causal=True).sum(), (q, k, v))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape] and all(g.is_meta for g in grads)
    logits = _t(6, 37, grad=True)
    (dlogits,) = torch.autograd.grad(llmk.cross_entropy(logits, _i64(6)), (logits,))
    assert dlogits.shape == logits.shape and dlogits.is_meta


def test_meta_errors_name_the_op():
    """A call the C++ op would reject is rejected on meta tensors with its error, by the fake."""
    with pytest.raises(RuntimeError, match="^linear: activation 'silu_mul' needs an even number of weight rows"):
        llmk.linear(_t(5, 64), _t(47, 64), None, None, "silu_mul")
    with pytest.raises(RuntimeError, match="^linear: activation must be 'none', 'silu_mul', 'gelu' or 'gelu_tanh'"):
        llmk.linear(_t(5, 64), _t(48, 64), None, None, "relu")
    with pytest.raises(RuntimeError, match="^linear: weight has 3 dims"):
        llmk.linear(_t(5, 64), _t(2, 48, 64))
    with pytest.raises(RuntimeError, match="^geglu: approximate must be 'none' or 'tanh', got 'erf'"):
        llmk.geglu(_t(5, 32), _t(5, 32), "erf")
    with pytest.raises(RuntimeError, match="^bias_gelu_backward: approximate must be 'none' or 'tanh'"):
        llmk.bias_gelu_backward(_t(5, 64), _t(5, 64), _t(64), "sigmoid")
