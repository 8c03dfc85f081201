"""torch.ops.llmk.bias_gelu and bias_gelu_backward: values against the float64 definition on
CPU and CUDA (both GELU forms, odd, strided and many rows), autograd (dx and the
deterministic dbias) against float64 autograd, the backward's geometry boundaries (rows
per block, split rows, ragged column blocks, the N = 1 kernels) with bitwise-repeatable
dbias, CUDA-graph replay, opcheck, torch.compile(fullgraph=True), bad inputs."""

import pytest
import torch

import llmk
from conftest import DEVICES, DTYPES, RTOL, assert_close, gelu_ref, poison_allocator, requires_cuda


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


def check_backward(dy, x, b, approximate, dx, db, what=""):
    """dx and dbias of llmk.bias_gelu_backward against float64 autograd."""
    x64, b64 = x.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    ref(x64, b64, approximate).backward(dy.double())
    scale = dy.double().abs().max().item()
    rtol = RTOL[x.dtype]
    assert_close(dx, x64.grad, rtol, f"dx{what}", atol=1e-2 * rtol * scale)
    # dbias sums `rows` fp32 terms of size <= 1.13 |dy|, each rounded differently.
    assert_close(db, b64.grad, rtol, f"dbias{what}", atol=2e-6 * x.shape[0] * 1.13 * scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_autograd_matches_float64(device, dtype, approximate):
    buf = torch.randn(700, 2 * 1000, device=device, dtype=dtype)
    x = buf[:, :1000].requires_grad_()  # strided rows
    b = torch.randn(1000, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn(700, 1000, device=device, dtype=dtype)
    llmk.bias_gelu(x, b, approximate).backward(dy)
    check_backward(dy, x, b, approximate, x.grad, b.grad)
    if device == "cuda":  # the bias gradient is summed in a fixed order
        again = llmk.bias_gelu_backward(dy, x.detach(), b.detach(), approximate)[1]
        assert torch.equal(again, llmk.bias_gelu_backward(dy, x.detach(), b.detach(), approximate)[1])


# ty ~ rows up to 16 rows; unsplit up to 128 rows (127 in the N = 1 kernels), split from
# 129 (128): arrival counters, partial rows.
@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000, 5000])
@pytest.mark.parametrize("layout", ["vector", "strided", "scalar"])
def test_backward_geometry_boundaries(dtype, rows, layout):
    vec = 16 // torch.tensor([], dtype=dtype).element_size()
    # d an odd multiple of the vector (a ragged last column block); strided rows; d odd (N = 1).
    d = 129 if layout == "scalar" else vec * 129
    approximate = "tanh" if rows % 2 else "none"
    width = d + (2 * vec if layout == "strided" else 0)
    x = (torch.randn(rows, width, device="cuda", dtype=dtype) * 2)[:, :d]
    dy = torch.randn(rows, width, device="cuda", dtype=dtype)[:, :d]
    b = torch.randn(d, device="cuda", dtype=dtype)
    poison_allocator(dy, 4)  # outputs and workspace (arrival counters) start as NaN bits
    dx, db = llmk.bias_gelu_backward(dy, x, b, approximate)
    check_backward(dy, x, b, approximate, dx, db)
    for _ in range(2):  # the same dbias bits on every call
        poison_allocator(dy, 4)
        assert torch.equal(llmk.bias_gelu_backward(dy, x, b, approximate)[1], db)


@requires_cuda
@pytest.mark.parametrize("d", [8 * 129, 129])
def test_backward_cuda_graph_replay(d):
    """Split rows in a captured graph: the counter memset is part of the graph, so replays
    start from zeroed counters; they give the eager dbias bits, and new values of dy."""
    rows, dtype = 5000, torch.bfloat16
    x = torch.randn(rows, d, device="cuda", dtype=dtype) * 2
    b = torch.randn(d, device="cuda", dtype=dtype)
    dy = torch.randn(rows, d, device="cuda", dtype=dtype)
    want = llmk.bias_gelu_backward(dy, x, b, "tanh")[1]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dx, db = llmk.bias_gelu_backward(dy, x, b, "tanh")
    for _ in range(3):
        db.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(db, want)
    dy.copy_(torch.randn_like(dy))
    graph.replay()
    torch.cuda.synchronize()
    check_backward(dy, x, b, "tanh", dx, db, " after a replay with new dy")


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
