"""torch.ops.llmk.rmsnorm_backward called directly: gradients against float64 autograd,
the optional dresidual, and determinism of dweight."""

import pytest
import torch

import llmk
from conftest import DEVICES, DTYPES, HAS_CUDA, RTOL, assert_close, dx_term_scale, rmsnorm_ref


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (300, 896), (64, 4096), (5, 16384)])
def test_matches_float64_autograd(device, dtype, shape):
    x = torch.randn(shape, device=device, dtype=dtype)
    w = torch.randn(shape[-1], device=device, dtype=dtype)
    dy = torch.randn(shape, device=device, dtype=dtype)
    dres = torch.randn(shape, device=device, dtype=dtype)
    dx, dw = llmk.rmsnorm_backward(dy, x, w, 1e-5, 0.0, dres)
    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_()
    rmsnorm_ref(x64, w64, 1e-5).backward(dy.double())
    scale = max(dx_term_scale(x, w, dy, 1e-5), dres.abs().max().item())
    assert_close(dx, x64.grad + dres.double(), 2 * RTOL[dtype], "dx", atol=2 * RTOL[dtype] * scale)
    # dweight sums rows of dy * x * rstd in fp32: error relative to the terms' total size.
    terms = (dy.double() * x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5)).abs()
    assert_close(dw, w64.grad, RTOL[dtype], "dweight", atol=4e-6 * shape[0] * terms.max().item())


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device: GPU test skipped")
def test_dweight_is_deterministic():
    x = torch.randn(8192, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    first = llmk.rmsnorm_backward(dy, x, w)[1]
    for _ in range(3):
        assert torch.equal(llmk.rmsnorm_backward(dy, x, w)[1], first)
