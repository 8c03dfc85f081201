"""torch.ops.llmk.bias_gelu and bias_gelu_backward: values against the float64 definition on
CPU and CUDA (both GELU forms, odd, strided and many rows), autograd (dx and the
deterministic dbias) against float64 autograd, opcheck, torch.compile(fullgraph=True), bad
inputs."""

import pytest
import torch

import llmk
from conftest import DEVICES, DTYPES, RTOL, assert_close, gelu_ref


def ref(x, b, approximate):
    return gelu_ref(x.double() + b.double(), approximate)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 5, 768), (33, 3072), (3000, 64)])
def test_matches_definition(device, dtype, approximate, shape):
    x = torch.randn(shape, device=device, dtype=dtype) * 3
    b = torch.randn(shape[-1], device=device, dtype=dtype)
    out = llmk.bias_gelu(x, b, approximate)
    assert out.dtype == dtype and out.shape == x.shape
    want = ref(x, b, approximate)
    # GELU of large negative inputs lands in float16's subnormals: an absolute step of 2^-24.
    # Plus one subnormal step: outputs below the normal range round absolutely, not relatively.
    atol = RTOL[dtype] * 1e-2 * want.abs().max().item() + (2.0**-24 if dtype == torch.float16 else torch.finfo(dtype).tiny)
    assert_close(out, want, RTOL[dtype], atol=atol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_autograd_matches_float64(device, dtype, approximate):
    buf = torch.randn(700, 2 * 1000, device=device, dtype=dtype)
    x = buf[:, :1000].requires_grad_()  # strided rows
    b = torch.randn(1000, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn(700, 1000, device=device, dtype=dtype)
    llmk.bias_gelu(x, b, approximate).backward(dy)
    x64, b64 = x.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    ref(x64, b64, approximate).backward(dy.double())
    scale = dy.double().abs().max().item()
    assert_close(x.grad, x64.grad, RTOL[dtype], "dx", atol=1e-2 * RTOL[dtype] * scale)
    assert_close(b.grad, b64.grad, RTOL[dtype], "dbias", atol=2e-6 * 700 * 1.13 * scale)
    if device == "cuda":  # the bias gradient is summed in a fixed order
        again = llmk.bias_gelu_backward(dy, x.detach(), b.detach(), approximate)[1]
        assert torch.equal(again, llmk.bias_gelu_backward(dy, x.detach(), b.detach(), approximate)[1])


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    backend = "inductor" if device == "cuda" else "aot_eager"
    w = torch.randn(128, 64, device=device)

    def mlp(x, b):
        return (llmk.bias_gelu(x @ w.t(), b, "tanh") * 2).square().sum()

    x = torch.randn(16, 64, device=device, requires_grad=True)
    b = torch.randn(128, device=device, requires_grad=True)
    out = torch.compile(mlp, fullgraph=True, backend=backend)(x, b)
    out.backward()
    x64, b64 = x.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    want = (ref(x64 @ w.double().t(), b64, "tanh") * 2).square().sum()
    want.backward()
    assert_close(out.detach().reshape(1), want.detach().reshape(1), 1e-4)
    assert_close(x.grad, x64.grad, 1e-4, atol_scale=0.05)
    assert_close(b.grad, b64.grad, 1e-4, atol_scale=0.05)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    x = torch.randn(4, 64, device=device)
    with pytest.raises(RuntimeError, match="bias_gelu: bias has dtype float16, expected float32"):
        llmk.bias_gelu(x, torch.zeros(64, device=device, dtype=torch.float16))
    with pytest.raises(RuntimeError, match=r"bias_gelu: bias must have shape \[64\]"):
        llmk.bias_gelu(x, torch.zeros(32, device=device))
    with pytest.raises(RuntimeError, match="approximate must be 'none' or 'tanh'"):
        llmk.bias_gelu(x, torch.zeros(64, device=device), "fast")
    assert llmk.bias_gelu(x[:0], torch.zeros(64, device=device)).shape == (0, 64)
    dx, db = llmk.bias_gelu_backward(x[:0], x[:0], torch.zeros(64, device=device))
    assert dx.shape == (0, 64) and torch.equal(db, torch.zeros(64, device=device))
