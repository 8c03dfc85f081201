"""torch.ops.llmk.layernorm (and layernorm_with_stats) and layernorm_backward: values against the
float64 definition on CPU and CUDA (optional weight and bias, inputs far from zero), the
statistics the forward saves and the backward reads, autograd against float64 autograd,
opcheck, torch.compile(fullgraph=True), llmk.nn.LayerNorm as a drop-in, bad inputs."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import llmk
from conftest import DEVICES, DTYPES, RTOL, assert_close


def layernorm_ref(x, w, b, eps):
    x64 = x.double()
    mean = x64.mean(-1, keepdim=True)
    y = (x64 - mean) * torch.rsqrt((x64 - mean).pow(2).mean(-1, keepdim=True) + eps)
    if w is not None:
        y = y * w.double()
    if b is not None:
        y = y + b.double()
    return y


def output_scale(x, w, b, eps):
    """Largest term of the output: its error is relative to this, not to the (cancelling) sum."""
    y = layernorm_ref(x, w, None, eps).abs()
    return (y + (b.double().abs() if b is not None else 0)).max().item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 5, 768), (17, 4096), (4, 5120), (2, 65536)])
def test_matches_definition(device, dtype, shape):
    x = torch.randn(shape, device=device, dtype=dtype) * 2 + 3
    w = torch.randn(shape[-1], device=device, dtype=dtype)
    b = torch.randn(shape[-1], device=device, dtype=dtype)
    y = llmk.layernorm(x, w, b, 1e-5)
    assert y.dtype == dtype and y.shape == x.shape
    assert_close(y, layernorm_ref(x, w, b, 1e-5), RTOL[dtype], atol=RTOL[dtype] * output_scale(x, w, b, 1e-5))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", [(False, False), (True, False), (False, True)])
def test_optional_parameters_and_strided_rows(device, dtype, affine):
    qkv = torch.randn(9, 3 * 1024, device=device, dtype=dtype)
    x = qkv[:, 1024:2048]
    w = torch.randn(1024, device=device, dtype=torch.float32) if affine[0] else None
    b = torch.randn(1024, device=device, dtype=torch.float32) if affine[1] else None
    y = llmk.layernorm(x, w, b, 1e-6)
    assert_close(y, layernorm_ref(x, w, b, 1e-6), RTOL[dtype], atol=RTOL[dtype] * output_scale(x, w, b, 1e-6))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_autograd_matches_float64(device, dtype):
    x = (torch.randn(6, 3, 256, device=device, dtype=dtype) + 1).requires_grad_()
    w = torch.randn(256, device=device, dtype=dtype).requires_grad_()
    b = torch.randn(256, device=device, dtype=dtype).requires_grad_()
    dy = torch.randn(6, 3, 256, device=device, dtype=dtype)
    llmk.layernorm(x, w, b, 1e-5).backward(dy)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    layernorm_ref(x64, w64, b64, 1e-5).backward(dy.double())
    term = (dy.double() * w.detach().double()).abs().max().item() * 4
    assert_close(x.grad, x64.grad, 2 * RTOL[dtype], "dx", atol=2 * RTOL[dtype] * term)
    assert_close(w.grad, w64.grad, 4 * RTOL[dtype], "dweight", atol_scale=0.05)
    assert_close(b.grad, b64.grad, 4 * RTOL[dtype], "dbias", atol_scale=0.05)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 7), (2, 5, 768), (300, 4096), (1031, 256), (4, 40000)])
def test_saved_statistics(device, dtype, shape):
    """return_stats gives each row's mean and rstd; layernorm_backward reads the ones it is given
    (moved off x's here, so a backward that recomputed them would fail) on every kernel path."""
    x = torch.randn(shape, device=device, dtype=dtype) * 2 + 3
    w = torch.randn(shape[-1], device=device, dtype=dtype)
    y, mean, rstd = llmk.layernorm(x, w, None, 1e-5, return_stats=True)
    x64 = x.double()
    mean64 = x64.mean(-1)
    rstd64 = torch.rsqrt((x64 - mean64[..., None]).pow(2).mean(-1) + 1e-5)
    assert mean.dtype == rstd.dtype == torch.float32 and mean.shape == rstd.shape == shape[:-1]
    assert_close(mean, mean64, 1e-5, "mean", atol=1e-5 * x64.abs().max().item())
    assert_close(rstd, rstd64, 1e-5, "rstd")
    assert_close(y, layernorm_ref(x, w, None, 1e-5), RTOL[dtype], atol=RTOL[dtype] * output_scale(x, w, None, 1e-5))
    mean, rstd = mean + 0.1, rstd * 1.25
    dy = torch.randn(shape, device=device, dtype=dtype)
    dx, dw, db = llmk.layernorm_backward(dy, x, w, 1e-5, True, mean, rstd)
    # The backward of y = (x - m) * r * w + b at the given m and r: xhat = (x - m) r, g = dy w,
    # dx = r (g - mean(g) - xhat mean(g xhat)), dw = sum dy xhat, db = sum dy.
    xhat = (x64 - mean.double()[..., None]) * rstd.double()[..., None]
    g = dy.double() * w.double()
    dx64 = rstd.double()[..., None] * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    term = (g.abs().max().item() + 1) * 4 * 1.25
    assert_close(dx, dx64, 2 * RTOL[dtype], "dx", atol=2 * RTOL[dtype] * term)
    assert_close(dw, (dy.double() * xhat).flatten(0, -2).sum(0), 4 * RTOL[dtype], "dweight", atol_scale=0.05)
    assert_close(db, dy.double().flatten(0, -2).sum(0), 4 * RTOL[dtype], "dbias", atol_scale=0.05)


class _OpLog(TorchDispatchMode):
    """The ops dispatched while it is active (the autograd engine's own included)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_saves_the_forward_statistics(device):
    """Under autograd the forward is layernorm_with_stats; without a gradient, the plain op."""
    x = torch.randn(4, 96, device=device, requires_grad=True)
    w = torch.randn(96, device=device)
    y = llmk.layernorm(x, w)
    saved = y.grad_fn.saved_tensors  # x, weight, and the forward's mean and rstd
    assert len(saved) == 4 and all(t.dtype == torch.float32 and t.shape == (4,) for t in saved[2:]), saved
    with _OpLog() as log:
        y.backward(torch.ones_like(y))
    # The statistics' gradients are not materialized (each would be a zero-fill kernel).
    assert not [op for op in log.ops if "zero" in op or "fill" in op], log.ops
    assert x.grad is not None and torch.isfinite(x.grad).all()
    with torch.no_grad():
        assert llmk.layernorm(x, w).grad_fn is None


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    backend = "inductor" if device == "cuda" else "aot_eager"

    def block(x, w, b):
        return llmk.layernorm(x + 1, w, b).square().sum()

    x = torch.randn(4, 128, device=device, requires_grad=True)
    w = torch.randn(128, device=device, requires_grad=True)
    b = torch.randn(128, device=device, requires_grad=True)
    out = torch.compile(block, fullgraph=True, backend=backend)(x, w, b)
    out.backward()
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    want = layernorm_ref(x64 + 1, w64, b64, 1e-5).square().sum()
    want.backward()
    assert_close(out.detach().reshape(1), want.detach().reshape(1), 1e-4)
    for got, ref, name in ((x.grad, x64.grad, "dx"), (w.grad, w64.grad, "dweight"), (b.grad, b64.grad, "dbias")):
        assert_close(got, ref, 1e-4, name, atol_scale=0.05)


@pytest.mark.parametrize("device", DEVICES)
def test_nn_layernorm_is_a_drop_in(device):
    ref = torch.nn.LayerNorm(96, eps=1e-6).to(device)
    with torch.no_grad():
        ref.weight.copy_(torch.randn(96))
        ref.bias.copy_(torch.randn(96))
    ours = llmk.nn.LayerNorm(96, eps=1e-6).to(device)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(8, 96, device=device)
    assert_close(ours(x), ref(x), 1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    x = torch.randn(4, 64, device=device, dtype=torch.bfloat16)
    w = torch.randn(64, device=device, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="layernorm: weight is bfloat16 but bias is float32"):
        llmk.layernorm(x, w, w.float())
    with pytest.raises(RuntimeError, match=r"layernorm: bias must have shape \[64\]"):
        llmk.layernorm(x, w, w[:32])
    with pytest.raises(RuntimeError, match="layernorm: eps must be"):
        llmk.layernorm(x, w, None, -1.0)
    assert llmk.layernorm(x[:0], w).shape == (0, 64)
    stat = torch.ones(4, device=device)
    with pytest.raises(RuntimeError, match="layernorm_backward: mean and rstd go together"):
        llmk.layernorm_backward(x, x, w, 1e-5, True, stat, None)
    with pytest.raises(RuntimeError, match=r"layernorm_backward: mean must have shape \[4\]"):
        llmk.layernorm_backward(x, x, w, 1e-5, True, stat[:3], stat)
    with pytest.raises(RuntimeError, match="layernorm_backward: rstd has dtype bfloat16, expected float32"):
        llmk.layernorm_backward(x, x, w, 1e-5, True, stat, stat.bfloat16())
    # The C++ reference of the eager op agrees with PyTorch's own kernel.
    assert_close(llmk.layernorm(x.float(), w.float()), F.layer_norm(x.float(), (64,), w.float()), 1e-5, atol=1e-5)
