"""llmk.rmsnorm_linear (torch.ops.llmk.rmsnorm_linear): rmsnorm(x, norm_weight) · weightᵀ in one
launch, against rmsnorm in float64 then the matmul, with the FlashAttention error rule (our max
error at most 2x that of PyTorch's same-dtype composition, fp32 norm math rounded once then
F.linear, plus a small atol) on CPU and CUDA: decode row counts 1-64 (the kernel's range) and
more, odd and batched shapes, a norm weight in x's dtype or float32; gradients (dx,
dnorm_weight, dweight) against float64 autograd with the same rule; torch.compile(fullgraph=True);
bad inputs. The kernel's own cases are in tests/cpp/rmsnorm_linear_test.cc."""

import pytest
import torch
import torch.nn.functional as F

import llmk
from conftest import DEVICES, assert_flash_rule, f64, poison_allocator, requires_cuda, rmsnorm_ref

HALF = [torch.float16, torch.bfloat16]
EPS = 1e-6
ATOL_EPS = 0.05  # the rule's absolute slack: a twentieth of a rounding step of max|reference|
# Gradients go through rounded intermediates (the normalized rows, dy · W) in both
# implementations; at small M they are not averaged out: a rounding step of slack (see test_linear.py).
GRAD_ATOL_EPS = 1.0

# (leading dims of x, K, N)
CPU_SHAPES = [((1,), 64, 32), ((5,), 136, 24), ((2, 3), 64, 48), ((16,), 200, 13), ((1,), 8, 1)]
CUDA_SHAPES = CPU_SHAPES + [((1,), 4096, 6144), ((16,), 4096, 1024), ((64,), 3584, 520), ((65,), 1024, 256),
                            ((2, 100), 512, 264)]
CASES = [("cpu", s) for s in CPU_SHAPES] + [pytest.param("cuda", s, marks=requires_cuda) for s in CUDA_SHAPES]


def torch_composed(x, g, w):
    """PyTorch's unfused same-dtype form (Hugging Face's RMSNorm: fp32 math, one rounding), then F.linear."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * g.float()
    return F.linear(y.to(x.dtype), w)


def reference(x, g, w):
    return F.linear(rmsnorm_ref(x, g, EPS), w.double())


def make(lead, k, n, dtype, g_dtype, device, grad=False):
    x = torch.randn(*lead, k, device=device, dtype=dtype) * 3
    g = (1 + 0.5 * torch.randn(k, device=device)).to(g_dtype)
    w = (torch.randn(n, k, device=device) / k**0.5).to(dtype)
    return [t.requires_grad_(grad) for t in (x, g, w)]


def assert_rule(got, want, theirs, dtype, what, atol_eps=ATOL_EPS):
    assert_flash_rule(got, want, theirs, dtype, what, atol_eps)


@pytest.mark.parametrize("device,shape", CASES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("g_f32", [False, True], ids=["g_like_x", "g_f32"])
def test_forward(device, shape, dtype, g_f32):
    lead, k, n = shape
    x, g, w = make(lead, k, n, dtype, torch.float32 if g_f32 else dtype, device)
    poison_allocator(x)
    out = llmk.rmsnorm_linear(x, g, w, EPS)
    assert out.dtype == dtype and out.shape == (*lead, n) and out.is_contiguous()
    assert_rule(out, reference(x, g, w), torch_composed(x, g, w), dtype, "rmsnorm_linear")


@pytest.mark.parametrize("device,shape", CASES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("g_f32", [False, True], ids=["g_like_x", "g_f32"])
def test_backward(device, shape, dtype, g_f32):
    lead, k, n = shape
    x, g, w = make(lead, k, n, dtype, torch.float32 if g_f32 else dtype, device, grad=True)
    out = llmk.rmsnorm_linear(x, g, w, EPS)
    dy = torch.randn_like(out)
    out.backward(dy)
    ref_inputs = [f64(t) for t in (x, g, w)]
    reference(*ref_inputs).backward(dy.double())
    same = [t.detach().clone().requires_grad_() for t in (x, g, w)]
    torch_composed(*same).backward(dy)
    for name, ours, ref, theirs in zip(("dx", "dnorm_weight", "dweight"), (x, g, w), ref_inputs, same):
        assert ours.grad.dtype == ours.dtype, f"{name} is {ours.grad.dtype}"
        assert_rule(ours.grad, ref.grad, theirs.grad, dtype, name, GRAD_ATOL_EPS)


@requires_cuda
@pytest.mark.parametrize("path", ["auto", "small_m"])
@pytest.mark.parametrize("m", [33, 64, 100])
def test_cuda_paths_from_33_rows(path, m, monkeypatch):
    """From 33 rows the automatic path on a Hopper GPU is rmsnorm into scratch memory + the
    Hopper GEMM; LLMK_GEMM_PATH set to a kernel keeps the one-launch small-M kernel (in 64-row
    chunks past 64): both against float64, with strided x rows, float32 and half norm weights,
    and a float32 norm weight 16- but not 32-byte aligned (the norm's scalar loads)."""
    monkeypatch.setenv("LLMK_GEMM_PATH", path)
    x, g, w = make((m,), 1024, 520, torch.bfloat16, torch.float32, "cuda")
    assert_rule(llmk.rmsnorm_linear(x, g, w, EPS), reference(x, g, w), torch_composed(x, g, w), torch.bfloat16,
                f"rmsnorm_linear {path} M = {m}")
    xs = torch.randn(m, 1024 + 24, device="cuda", dtype=torch.float16)[:, 8:8 + 1024]
    w16 = w.half()
    g_offset = torch.empty(1024 + 4, device="cuda")[4:]  # 16 bytes past a 256-byte boundary
    g_offset.copy_(g)
    for gv, what in ((g.half(), "half g"), (g, "float32 g"), (g_offset, "float32 g, 16-byte aligned")):
        assert_rule(llmk.rmsnorm_linear(xs, gv, w16, EPS), reference(xs, gv, w16), torch_composed(xs, gv, w16),
                    torch.float16, f"rmsnorm_linear {path} M = {m} strided x, {what}")


@pytest.mark.parametrize("device", DEVICES)
def test_default_eps_and_frozen_weights(device):
    x, g, w = make((3,), 64, 16, torch.bfloat16, torch.bfloat16, device)
    assert torch.equal(llmk.rmsnorm_linear(x, g, w), llmk.rmsnorm_linear(x, g, w, 1e-6))
    x.requires_grad_()  # inference-style frozen weights: only dx
    llmk.rmsnorm_linear(x, g, w).float().sum().backward()
    assert x.grad is not None and g.grad is None and w.grad is None


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    backend = "inductor" if device == "cuda" else "aot_eager"

    def block(x, g, w_qkv, w_o):
        return llmk.linear(llmk.rmsnorm_linear(x, g, w_qkv, EPS)[..., :64], w_o, None, x)

    x, g, w = make((1, 4), 64, 192, torch.bfloat16, torch.bfloat16, device, grad=True)
    w_o = (torch.randn(64, 64, device=device) / 8).to(torch.bfloat16).requires_grad_()
    torch._dynamo.reset()
    out = torch.compile(block, fullgraph=True, backend=backend)(x, g, w, w_o)
    dy = torch.randn_like(out)
    out.backward(dy)
    leaves = [t.detach().clone().requires_grad_() for t in (x, g, w, w_o)]
    eager = block(*leaves)
    eager.backward(dy)
    torch.testing.assert_close(out, eager, rtol=2e-2, atol=2e-2)
    for t, e in zip((x, g, w, w_o), leaves):
        torch.testing.assert_close(t.grad, e.grad, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    def t(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=device, dtype=dtype)

    x, g, w = t(4, 64), t(64), t(32, 64)
    with pytest.raises(RuntimeError, match="float32"):
        llmk.rmsnorm_linear(x.float(), g.float(), w.float())
    with pytest.raises(RuntimeError, match="rmsnorm_linear"):  # mixed x / weight dtypes
        llmk.rmsnorm_linear(x, g, w.half())
    with pytest.raises(RuntimeError, match="rmsnorm_linear"):  # norm weight of the wrong length
        llmk.rmsnorm_linear(x, t(63), w)
    with pytest.raises(RuntimeError, match="rmsnorm_linear"):  # K of x and weight differ
        llmk.rmsnorm_linear(x, g, t(32, 72))
    with pytest.raises(RuntimeError, match="rmsnorm_linear: weight has 3 dims"):
        llmk.rmsnorm_linear(x, g, t(2, 32, 64))
    with pytest.raises(RuntimeError, match="float64"):
        llmk.rmsnorm_linear(x.double(), g.double(), w.double())
