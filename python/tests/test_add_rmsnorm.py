"""torch.ops.llmk.add_rmsnorm (out of place, with autograd) and add_rmsnorm_ (in place, as
vLLM's fused_add_rms_norm) against the unfused composition."""

import pytest
import torch

import llmk
from conftest import DEVICES, DTYPES, RTOL, assert_close, rmsnorm_ref


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (5, 9), (3, 4, 2048), (33, 4096), (2, 16384)])
def test_out_of_place(device, dtype, shape):
    x = torch.randn(shape, device=device, dtype=dtype)
    residual = torch.randn(shape, device=device, dtype=dtype) * 4
    w = torch.randn(shape[-1], device=device, dtype=dtype)
    y, s = llmk.add_rmsnorm(x, residual, w, 1e-6)
    want_s = x + residual  # one rounding to the dtype, as the kernel
    assert torch.equal(s, want_s)
    assert_close(y, rmsnorm_ref(want_s, w, 1e-6), RTOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place(device, dtype):
    x = torch.randn(7, 3, 1024, device=device, dtype=dtype)
    residual = torch.randn(7, 3, 1024, device=device, dtype=dtype)
    w = torch.randn(1024, device=device, dtype=dtype)
    want_s = x + residual
    want_y = rmsnorm_ref(want_s, w, 1e-5, 1.0)
    llmk.add_rmsnorm_(x, residual, w, 1e-5, offset=1.0)
    assert torch.equal(residual, want_s)
    assert_close(x, want_y, RTOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_autograd(device):
    x = torch.randn(6, 512, device=device, requires_grad=True)
    r = torch.randn(6, 512, device=device, requires_grad=True)
    w = torch.randn(512, device=device, requires_grad=True)
    dy, ds = torch.randn(6, 512, device=device), torch.randn(6, 512, device=device)
    y, s = llmk.add_rmsnorm(x, r, w, 1e-6)
    torch.autograd.backward([y, s], [dy, ds])
    x64, r64, w64 = (t.detach().double().requires_grad_() for t in (x, r, w))
    s64 = x64 + r64
    torch.autograd.backward([rmsnorm_ref(s64, w64, 1e-6), s64], [dy.double(), ds.double()])
    for got, want, name in ((x.grad, x64.grad, "dx"), (r.grad, r64.grad, "dresidual"), (w.grad, w64.grad, "dweight")):
        assert_close(got, want, 1e-4, name, atol_scale=0.05)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph_in_place(device):
    backend = "inductor" if device == "cuda" else "aot_eager"

    def layer(x, residual, w):
        llmk.add_rmsnorm_(x, residual, w, 1e-6)
        return x * 2

    x = torch.randn(4, 256, device=device)
    r = torch.randn(4, 256, device=device)
    w = torch.randn(256, device=device)
    want = 2 * rmsnorm_ref(x + r, w, 1e-6)
    got = torch.compile(layer, fullgraph=True, backend=backend)(x.clone(), r.clone(), w)
    assert_close(got, want, 1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    x = torch.randn(4, 64, device=device)
    w = torch.randn(64, device=device)
    with pytest.raises(RuntimeError, match="add_rmsnorm: residual has shape"):
        llmk.add_rmsnorm(x, torch.randn(4, 32, device=device), w)
    with pytest.raises(RuntimeError, match="add_rmsnorm: residual has dtype float16"):
        llmk.add_rmsnorm(x, x.half(), w)
    with pytest.raises(RuntimeError, match="add_rmsnorm_: x and residual are the same tensor"):
        llmk.add_rmsnorm_(x, x, w)
