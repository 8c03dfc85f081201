"""torch.ops.llmk.silu_and_mul, gelu_and_mul, swiglu, geglu and their backwards: values against the
float64 definition on CPU and CUDA (odd and strided rows, inputs far in the tails), autograd
against float64 autograd, opcheck, torch.compile(fullgraph=True), bad inputs."""

import pytest
import torch
import torch.nn.functional as F

import llmk
from conftest import DEVICES, DTYPES, RTOL, assert_close, gelu_ref

ACTS = ["silu", "gelu", "gelu_tanh"]


def act_ref(g, act):
    if act == "silu":
        return F.silu(g)
    return gelu_ref(g, "tanh" if act == "gelu_tanh" else "none")


def gated_ref(x, act):
    g, u = x.double().chunk(2, dim=-1)
    return act_ref(g, act) * u


def ours(x, act):
    if act == "silu":
        return llmk.silu_and_mul(x)
    return llmk.gelu_and_mul(x, "tanh" if act == "gelu_tanh" else "none")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shape", [(1, 2), (3, 14), (2, 5, 1536), (17, 2 * 4864), (2, 2 * 14336)])
def test_matches_definition(device, dtype, act, shape):
    x = torch.randn(shape, device=device, dtype=dtype) * 2
    y = ours(x, act)
    assert y.dtype == dtype and y.shape == (*shape[:-1], shape[-1] // 2)
    want = gated_ref(x, act)
    # Products of tiny activations land in float16's subnormals: an absolute step of 2^-24.
    atol = RTOL[dtype] * 1e-3 * want.abs().max().item() + (2.0**-24 if dtype == torch.float16 else 0.0)
    assert_close(y, want, RTOL[dtype], atol=atol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_rows_and_two_tensor_form(device, dtype):
    wide = torch.randn(9, 3 * 1024, device=device, dtype=dtype)
    x = wide[:, :2048]  # rows 3072 apart
    assert_close(llmk.silu_and_mul(x), gated_ref(x, "silu"), RTOL[dtype])
    gate, up = wide[:, :1024], wide[:, 2048:]
    assert_close(llmk.swiglu(gate, up), F.silu(gate.double()) * up.double(), RTOL[dtype])
    odd = torch.randn(5, 2 * 1001, device=device, dtype=dtype)[:, 1:2001]  # unaligned: scalar path
    assert_close(llmk.gelu_and_mul(odd), gated_ref(odd, "gelu"), RTOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("act", ACTS)
def test_large_inputs_stay_finite(device, act):
    x = torch.randn(4, 64, device=device, dtype=torch.bfloat16) * 5000
    y = ours(x, act)
    assert torch.isfinite(y).all()
    assert_close(y, gated_ref(x, act), RTOL[torch.bfloat16])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ACTS)
def test_autograd_matches_float64(device, dtype, act):
    x = (torch.randn(6, 3, 512, device=device, dtype=dtype) * 2).requires_grad_()
    dy = torch.randn(6, 3, 256, device=device, dtype=dtype)
    ours(x, act).backward(dy)
    x64 = x.detach().double().requires_grad_()
    gated_ref(x64, act).backward(dy.double())
    assert_close(x.grad, x64.grad, RTOL[dtype], "dx", atol=RTOL[dtype] * x64.grad.abs().max().item())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_autograd_matches_float64(device, dtype):
    gate = torch.randn(7, 300, device=device, dtype=dtype).requires_grad_()
    up = torch.randn(7, 300, device=device, dtype=dtype).requires_grad_()
    dy = torch.randn(7, 300, device=device, dtype=dtype).t().contiguous().t()  # non-row-major grad
    llmk.swiglu(gate, up).backward(dy)
    g64, u64 = (t.detach().double().requires_grad_() for t in (gate, up))
    (F.silu(g64) * u64).backward(dy.double())
    for got, want, name in ((gate.grad, g64.grad, "dgate"), (up.grad, u64.grad, "dup")):
        assert_close(got, want, RTOL[dtype], name, atol=RTOL[dtype] * want.abs().max().item())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 5, 768), (17, 4864)])
def test_geglu_matches_definition(device, dtype, approximate, shape):
    gate = torch.randn(shape, device=device, dtype=dtype) * 2
    up = torch.randn(shape, device=device, dtype=dtype)
    y = llmk.geglu(gate, up, approximate)
    assert y.dtype == dtype and y.shape == shape
    want = gelu_ref(gate.double(), approximate) * up.double()
    # As test_matches_definition: float16's subnormal step below the relative tolerance.
    atol = RTOL[dtype] * 1e-3 * want.abs().max().item() + (2.0**-24 if dtype == torch.float16 else 0.0)
    assert_close(y, want, RTOL[dtype], atol=atol)
    assert torch.equal(llmk.geglu(gate, up), llmk.geglu(gate, up, "none"))  # the default


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_geglu_strided_rows_and_fused_form(device, dtype):
    wide = torch.randn(9, 3 * 1024, device=device, dtype=dtype)
    gate, up = wide[:, :1024], wide[:, 2048:]  # rows 3072 apart
    assert_close(llmk.geglu(gate, up, "tanh"), gelu_ref(gate.double(), "tanh") * up.double(), RTOL[dtype])
    odd = torch.randn(5, 2 * 1001, device=device, dtype=dtype)[:, 1:2001]  # unaligned: scalar path
    g, u = odd.chunk(2, dim=-1)
    assert torch.equal(llmk.geglu(g, u), llmk.gelu_and_mul(odd))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_geglu_autograd_matches_float64(device, dtype, approximate):
    gate = (torch.randn(7, 300, device=device, dtype=dtype) * 2).requires_grad_()
    up = torch.randn(7, 300, device=device, dtype=dtype).requires_grad_()
    dy = torch.randn(7, 300, device=device, dtype=dtype).t().contiguous().t()  # non-row-major grad
    llmk.geglu(gate, up, approximate).backward(dy)
    g64, u64 = (t.detach().double().requires_grad_() for t in (gate, up))
    (gelu_ref(g64, approximate) * u64).backward(dy.double())
    for got, want, name in ((gate.grad, g64.grad, "dgate"), (up.grad, u64.grad, "dup")):
        assert_close(got, want, RTOL[dtype], name, atol=RTOL[dtype] * want.abs().max().item())
    dgate, dup = llmk.geglu_backward(dy, gate.detach(), up.detach(), approximate)
    assert torch.equal(dgate, gate.grad) and torch.equal(dup, up.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    backend = "inductor" if device == "cuda" else "aot_eager"

    def mlp(x, w):
        return (llmk.silu_and_mul(x @ w) + llmk.gelu_and_mul(x @ w, "tanh")).square().sum()

    x = torch.randn(8, 64, device=device, requires_grad=True)
    w = torch.randn(64, 128, device=device)
    out = torch.compile(mlp, fullgraph=True, backend=backend)(x, w)
    out.backward()
    x64 = x.detach().double().requires_grad_()
    h = x64 @ w.double()
    want = (gated_ref(h, "silu") + gated_ref(h, "gelu_tanh")).square().sum()
    want.backward()
    assert_close(out.detach().reshape(1), want.detach().reshape(1), 1e-4)
    assert_close(x.grad, x64.grad, 1e-4, "dx", atol_scale=0.05)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    x = torch.randn(4, 63, device=device, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="silu_and_mul: x's last dim must be even"):
        llmk.silu_and_mul(x)
    with pytest.raises(RuntimeError, match="approximate must be 'none' or 'tanh'"):
        llmk.gelu_and_mul(torch.randn(4, 64, device=device), "erf")
    with pytest.raises(RuntimeError, match="swiglu: up must have gate's leading dims"):
        llmk.swiglu(torch.randn(4, 32, device=device), torch.randn(4, 33, device=device))
    with pytest.raises(RuntimeError, match="swiglu: up has dtype float16"):
        llmk.swiglu(torch.randn(4, 32, device=device), torch.randn(4, 32, device=device, dtype=torch.half))
    with pytest.raises(RuntimeError, match="geglu: up must have gate's leading dims"):
        llmk.geglu(torch.randn(4, 32, device=device), torch.randn(4, 33, device=device))
    with pytest.raises(RuntimeError, match="geglu: approximate must be 'none' or 'tanh', got 'erf'"):
        llmk.geglu(torch.randn(4, 32, device=device), torch.randn(4, 32, device=device), "erf")
    with pytest.raises(RuntimeError, match="geglu_backward: up has dtype float16"):
        llmk.geglu_backward(*(torch.randn(4, 32, device=device) for _ in range(2)),
                            torch.randn(4, 32, device=device, dtype=torch.half))
    assert llmk.silu_and_mul(torch.randn(0, 64, device=device)).shape == (0, 32)
    assert llmk.geglu(*(torch.randn(0, 32, device=device) for _ in range(2)), "tanh").shape == (0, 32)
