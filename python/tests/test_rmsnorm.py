"""torch.ops.llmk.rmsnorm: values against the float64 definition on CPU and CUDA, autograd
against float64 autograd, opcheck, torch.compile(fullgraph=True), llmk.nn.RMSNorm as a
drop-in, and bad inputs."""

import pytest
import torch

import llmk
from conftest import DEVICES, DTYPES, HAS_CUDA, RTOL, assert_close, dx_term_scale, requires_cuda, rmsnorm_ref


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 5, 896), (17, 4096), (4, 5120), (2, 65536)])
def test_matches_definition(device, dtype, shape):
    x = torch.randn(shape, device=device, dtype=dtype) * 3
    w = torch.randn(shape[-1], device=device, dtype=dtype)
    y = llmk.rmsnorm(x, w, 1e-5)
    assert y.dtype == dtype and y.shape == x.shape
    assert_close(y, rmsnorm_ref(x, w, 1e-5), RTOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_offset_fp32_weight_rstd_and_strided_rows(device, dtype):
    qkv = torch.randn(9, 3 * 1024, device=device, dtype=dtype)
    q = qkv[:, :1024]  # row stride 3072: a slice of a fused projection
    w = torch.randn(1024, device=device, dtype=torch.float32)
    y, rstd = llmk.rmsnorm(q, w, 1e-6, offset=1.0, return_rstd=True)
    assert_close(y, rmsnorm_ref(q, w, 1e-6, 1.0), RTOL[dtype])
    want_rstd = torch.rsqrt(q.double().pow(2).mean(-1) + 1e-6)
    assert rstd.dtype == torch.float32 and rstd.shape == (9,)
    assert_close(rstd, want_rstd, 1e-5, "rstd")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_autograd_matches_float64(device, dtype, offset):
    x = (torch.randn(6, 3, 256, device=device, dtype=dtype)).requires_grad_()
    w = torch.randn(256, device=device, dtype=dtype).requires_grad_()
    dy = torch.randn(6, 3, 256, device=device, dtype=dtype)
    llmk.rmsnorm(x, w, 1e-6, offset).backward(dy)
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    rmsnorm_ref(x64, w64, 1e-6, offset).backward(dy.double())
    scale = dx_term_scale(x.detach(), w.detach(), dy, 1e-6, offset)
    assert_close(x.grad, x64.grad, 2 * RTOL[dtype], "dx", atol=2 * RTOL[dtype] * scale)
    # dweight sums 18 rows before one rounding: its error is relative to the sum's scale.
    assert_close(w.grad, w64.grad, 4 * RTOL[dtype], "dweight", atol_scale=0.05)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    backend = "inductor" if device == "cuda" else "aot_eager"  # inductor on CPU is slow to build

    def block(x, w):
        return llmk.rmsnorm(x * 2, w, 1e-6).sum()

    compiled = torch.compile(block, fullgraph=True, backend=backend)
    x = torch.randn(4, 128, device=device, requires_grad=True)
    w = torch.randn(128, device=device, requires_grad=True)
    out = compiled(x, w)
    out.backward()
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    rmsnorm_ref(x64 * 2, w64, 1e-6).sum().backward()
    assert_close(out.detach().reshape(1), rmsnorm_ref(x.detach() * 2, w.detach(), 1e-6).sum().reshape(1), 1e-4)
    assert_close(x.grad, x64.grad, 1e-4, "dx", atol_scale=0.05)
    assert_close(w.grad, w64.grad, 1e-4, "dweight", atol_scale=0.05)


class LlamaStyleRMSNorm(torch.nn.Module):
    """The Hugging Face Llama formula, for the drop-in test."""

    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, h):
        dtype = h.dtype
        h = h.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_nn_rmsnorm_is_a_drop_in(device):
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), LlamaStyleRMSNorm(64, 1e-5)).to(device)
    with torch.no_grad():
        model[1].weight.copy_(torch.randn(64))
    x = torch.randn(8, 64, device=device)
    want = model(x)
    assert llmk.nn.patch_rmsnorm(model) == 1
    assert isinstance(model[1], llmk.nn.RMSNorm)
    assert_close(model(x), want, 1e-5)
    y, s = model[1](x, x)
    assert_close(s, 2 * x, 0)
    assert_close(y, rmsnorm_ref(2 * x, model[1].weight.detach(), 1e-5), 1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    x = torch.randn(4, 64, device=device, dtype=torch.bfloat16)
    w = torch.randn(64, device=device, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="rmsnorm: weight has dtype float16"):
        llmk.rmsnorm(x, w.half())
    with pytest.raises(RuntimeError, match=r"rmsnorm: weight must have shape \[64\]"):
        llmk.rmsnorm(x, w[:32])
    with pytest.raises(RuntimeError, match="rmsnorm: eps must be"):
        llmk.rmsnorm(x, w, 0.0)
    with pytest.raises(RuntimeError, match="contiguous in its last dim"):
        llmk.rmsnorm(torch.randn(64, 4, device=device, dtype=torch.bfloat16).t(), w[:4])
    with pytest.raises(RuntimeError, match=r"rmsnorm: x has unsupported dtype int32 \(expected float32, float16"):
        llmk.rmsnorm(x.to(torch.int32), w)
    with pytest.raises(RuntimeError, match="rmsnorm: x is float64; llmk takes float32, float16, bfloat16"):
        llmk.rmsnorm(x.double(), w)
    with pytest.raises(RuntimeError, match="empty last dim"):
        llmk.rmsnorm(x[:, :0], w[:0])
    assert llmk.rmsnorm(x[:0], w).shape == (0, 64)  # no rows: an empty result


@requires_cuda
def test_device_mismatch():
    x = torch.randn(4, 64, device="cuda")
    with pytest.raises(RuntimeError, match="weight is on cpu:0 but x is on cuda:0"):
        llmk.rmsnorm(x, torch.randn(64))


@requires_cuda
def test_cuda_graph_capture():
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    y = llmk.rmsnorm(x, w)  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = llmk.rmsnorm(x, w)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(y, rmsnorm_ref(x, w, 1e-6), RTOL[torch.bfloat16])
