"""torch.ops.llmk.rmsnorm_swiglu (gated RMSNorm) and its backward: values against the
float64 definition on CPU and CUDA (register and loop paths, strided rows, weight dtypes,
Gemma's offset), equality with the two-op composition rmsnorm -> swiglu, autograd against
float64 autograd, opcheck, torch.compile(fullgraph=True), bad inputs."""

import pytest
import torch
import torch.nn.functional as F

import llmk
from conftest import DEVICES, DTYPES, RTOL, assert_close, rmsnorm_ref


def ref(x, gate, w, eps, offset=0.0):
    return rmsnorm_ref(x, w, eps, offset) * F.silu(gate.double())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 5, 128), (33, 4096), (4, 20000)])
def test_matches_definition(device, dtype, shape):
    x = torch.randn(shape, device=device, dtype=dtype)
    gate = torch.randn(shape, device=device, dtype=dtype) * 2
    w = torch.randn(shape[-1], device=device, dtype=dtype)
    out = llmk.rmsnorm_swiglu(x, gate, w, 1e-6)
    assert out.dtype == dtype and out.shape == x.shape
    assert_close(out, ref(x, gate, w, 1e-6), RTOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_strided_rows_weight_dtype_offset_and_composition(device):
    buf = torch.randn(64, 3 * 512, device=device, dtype=torch.bfloat16)
    x, gate = buf[:, :512], buf[:, 1024:]  # strided rows
    w = torch.randn(512, device=device)    # fp32 weight with bf16 activations
    assert_close(llmk.rmsnorm_swiglu(x, gate, w, 1e-5, 1.0), ref(x, gate, w, 1e-5, 1.0), RTOL[torch.bfloat16])
    # In fp32 it equals rmsnorm then swiglu up to the rounding of the normalized tensor.
    x32, g32, w32 = x.float(), gate.float(), w
    composed = llmk.swiglu(g32, llmk.rmsnorm(x32, w32, 1e-5))
    assert_close(llmk.rmsnorm_swiglu(x32, g32, w32, 1e-5), composed, 1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [96, 1000, 4096])
def test_autograd_matches_float64(device, dtype, d):
    x = torch.randn(37, d, device=device, dtype=dtype, requires_grad=True)
    gate = (torch.randn(37, d, device=device, dtype=dtype) * 2).requires_grad_()
    w = torch.randn(d, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn(37, d, device=device, dtype=dtype)
    llmk.rmsnorm_swiglu(x, gate, w, 1e-6).backward(dy)
    x64, g64, w64 = (t.detach().double().requires_grad_() for t in (x, gate, w))
    ref(x64, g64, w64, 1e-6).backward(dy.double())
    rstd = torch.rsqrt(x64.detach().pow(2).mean(-1, keepdim=True) + 1e-6)
    term = (rstd * dy.double() * w64.detach()).abs()
    assert_close(x.grad, x64.grad, RTOL[dtype], "dx", atol=2 * RTOL[dtype] * term.max().item())
    assert_close(gate.grad, g64.grad, RTOL[dtype], "dgate",
                 atol=RTOL[dtype] * (term * x64.detach().abs()).max().item())
    assert_close(w.grad, w64.grad, RTOL[dtype], "dweight", atol=1e-5 * 37 * (term * x64.detach().abs()).max().item())


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    backend = "inductor" if device == "cuda" else "aot_eager"

    def block(x, gate, w):
        return (llmk.rmsnorm_swiglu(x, gate, w) * 3).square().sum()

    x = torch.randn(16, 256, device=device, requires_grad=True)
    gate = torch.randn(16, 256, device=device, requires_grad=True)
    w = torch.randn(256, device=device, requires_grad=True)
    out = torch.compile(block, fullgraph=True, backend=backend)(x, gate, w)
    out.backward()
    x64, g64, w64 = (t.detach().double().requires_grad_() for t in (x, gate, w))
    want = (ref(x64, g64, w64, 1e-6) * 3).square().sum()
    want.backward()
    assert_close(out.detach().reshape(1), want.detach().reshape(1), 1e-4)
    for got, exp in ((x.grad, x64.grad), (gate.grad, g64.grad), (w.grad, w64.grad)):
        assert_close(got, exp, 1e-4, atol_scale=0.05)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    x = torch.randn(4, 64, device=device)
    with pytest.raises(RuntimeError, match=r"rmsnorm_swiglu: gate has shape \[4, 32\] but x has shape \[4, 64\]"):
        llmk.rmsnorm_swiglu(x, x[:, :32], torch.ones(64, device=device))
    with pytest.raises(RuntimeError, match="rmsnorm_swiglu: gate has dtype float16, expected float32"):
        llmk.rmsnorm_swiglu(x, x.half(), torch.ones(64, device=device))
    assert llmk.rmsnorm_swiglu(x[:0], x[:0], torch.ones(64, device=device)).shape == (0, 64)
