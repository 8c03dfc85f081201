"""llmk.linear (torch.ops.llmk.linear): act(x · weightᵀ + bias) + residual against a float64
reference with the FlashAttention error rule (our max error at most 2x that of PyTorch's own
same-dtype F.linear composition against the same reference, plus a small atol) on CPU (the
double-accumulation reference) and CUDA (the GEMM kernels: small-M split-K, Hopper, mma.sync),
every activation, bias and residual, sizes 1, odd, batched; transposed and strided operand
views; gradients (dx, dweight, dbias, dresidual) against float64 autograd with the same rule;
torch.compile(fullgraph=True) forward and backward; llmk.nn.Linear as a drop-in for
torch.nn.Linear; bad inputs. The kernels' own cases are in tests/cpp/gemm_test.cc."""

import pytest
import torch
import torch.nn.functional as F

import llmk
from conftest import DEVICES, assert_flash_rule, f64, gelu_ref, poison_allocator, requires_cuda

HALF = [torch.float16, torch.bfloat16]
ACTIVATIONS = ["none", "silu_mul", "gelu", "gelu_tanh"]
EPILOGUES = ["plain", "bias", "residual", "bias_residual"]
# The rule's absolute slack, in units of the dtype's epsilon times max|reference|: a twentieth
# of a rounding step, so a result as exact as PyTorch's (to its last bit) always passes.
ATOL_EPS = 0.05
# Gradients pass through a rounded intermediate (dZ = act'(z) dY, z recomputed or saved in the
# dtype) in both implementations; at small M a dweight element is a product of one or a few
# such roundings, not averaged out, so either side's max error can reach a whole rounding step
# of max|ref| by chance. The slack for gradients is that step.
GRAD_ATOL_EPS = 1.0

# (leading dims of x, K, N): N counts weight rows (N / 2 outputs for silu_mul).
CPU_SHAPES = [((1,), 64, 32), ((5,), 136, 24), ((2, 3), 64, 48), ((7,), 64, 26), ((1,), 8, 2), ((33,), 200, 72)]
# On the GPU also the kernels' boundaries: M <= 32 goes to the small-M split-K kernel (M <= 64
# without the Hopper kernel), above it to the Hopper (sm_90a) or mma.sync kernel; K and N not
# multiples of the tiles; a batched x. test_every_m_to_256 sweeps M across every boundary.
CUDA_SHAPES = CPU_SHAPES + [((16,), 4096, 512), ((64,), 1000, 264), ((65,), 512, 130), ((2, 129), 512, 1536),
                            ((300,), 1032, 392), ((1024,), 1024, 2048),
                            ((128,), 4096, 4096)]  # few tiles, long K: the Hopper kernel splits K
CASES = [("cpu", s) for s in CPU_SHAPES] + [pytest.param("cuda", s, marks=requires_cuda) for s in CUDA_SHAPES]


def activate(z, activation, exact=False):
    """The activation after z = x · Wᵀ + bias; `exact`: float64 without cancellation (gelu_ref)."""
    if activation == "silu_mul":
        gate, up = z.chunk(2, dim=-1)
        return F.silu(gate) * up
    if activation == "none":
        return z
    approximate = "tanh" if activation == "gelu_tanh" else "none"
    return gelu_ref(z, approximate) if exact else F.gelu(z, approximate=approximate)


def composed(x, w, b, r, activation, exact=False):
    """PyTorch's unfused composition: F.linear, the activation, the residual add."""
    y = activate(F.linear(x, w, b), activation, exact)
    return y if r is None else y + r


def make(lead, k, n, activation, epilogue, dtype, device, grad=False):
    n_out = n // 2 if activation == "silu_mul" else n
    x = torch.randn(*lead, k, device=device, dtype=dtype)
    w = (torch.randn(n, k, device=device) / k**0.5).to(dtype)
    b = (torch.randn(n, device=device) * 0.5).to(dtype) if "bias" in epilogue else None
    r = torch.randn(*lead, n_out, device=device, dtype=dtype) if "residual" in epilogue else None
    return [t.requires_grad_(grad) if t is not None else None for t in (x, w, b, r)]


def assert_rule(got, want, theirs, dtype, what, atol_eps=ATOL_EPS):
    assert_flash_rule(got, want, theirs, dtype, what, atol_eps)


@pytest.mark.parametrize("device,shape", CASES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_forward(device, shape, dtype, activation, epilogue):
    lead, k, n = shape
    x, w, b, r = make(lead, k, n, activation, epilogue, dtype, device)
    poison_allocator(x)
    out = llmk.linear(x, w, b, r, activation)
    n_out = n // 2 if activation == "silu_mul" else n
    assert out.dtype == dtype and out.shape == (*lead, n_out) and out.is_contiguous()
    want = composed(*map(f64, (x, w, b, r)), activation, exact=True)
    assert_rule(out, want, composed(x, w, b, r, activation), dtype, f"linear {activation} {epilogue}")


@pytest.mark.parametrize("device,shape", CASES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_backward(device, shape, dtype, activation):
    lead, k, n = shape
    x, w, b, r = make(lead, k, n, activation, "bias_residual", dtype, device, grad=True)
    out = llmk.linear(x, w, b, r, activation)
    dy = torch.randn_like(out)
    out.backward(dy)
    ref_inputs = list(map(f64, (x, w, b, r)))
    composed(*ref_inputs, activation, exact=True).backward(dy.double())
    same = [t.detach().clone().requires_grad_() for t in (x, w, b, r)]
    composed(*same, activation).backward(dy)
    for name, ours, ref, theirs in zip(("dx", "dweight", "dbias", "dresidual"), (x, w, b, r), ref_inputs, same):
        assert ours.grad.dtype == dtype, f"{name} is {ours.grad.dtype}"
        assert_rule(ours.grad, ref.grad, theirs.grad, dtype, f"{name} ({activation})", GRAD_ATOL_EPS)


@requires_cuda
@pytest.mark.parametrize("path,shape", [("sm80", ((300,), 1032, 392)), ("sm80", ((16,), 512, 264)),
                                        ("small_m", ((1,), 4096, 1024)), ("small_m", ((64,), 1000, 264)),
                                        ("sm90", ((65,), 512, 256)), ("sm90", ((2, 129), 512, 1536)),
                                        ("sm90", ((3,), 1024, 264)), ("sm90", ((128,), 4096, 520))])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_each_kernel_path(monkeypatch, path, shape, activation):
    """Each CUDA kernel, forced through LLMK_GEMM_PATH (the C++ API reads it per call), forward
    and the backward's transposed layouts (which the small-M kernel does not take: mma.sync)."""
    if path == "sm90" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper kernel needs an sm_90 device")
    lead, k, n = shape
    x, w, b, r = make(lead, k, n, activation, "bias_residual", torch.bfloat16, "cuda", grad=True)
    monkeypatch.setenv("LLMK_GEMM_PATH", path)
    out = llmk.linear(x, w, b, r, activation)
    dy = torch.randn_like(out)
    if path == "small_m":
        monkeypatch.setenv("LLMK_GEMM_PATH", "auto")
    out.backward(dy)
    monkeypatch.setenv("LLMK_GEMM_PATH", "auto")
    ref_inputs = list(map(f64, (x, w, b, r)))
    want = composed(*ref_inputs, activation, exact=True)
    same = [t.detach().clone().requires_grad_() for t in (x, w, b, r)]
    theirs = composed(*same, activation)
    assert_rule(out, want, theirs, torch.bfloat16, f"{path} out")
    want.backward(dy.double())
    theirs.backward(dy)
    for name, ours, ref, t in zip(("dx", "dweight"), (x, w), ref_inputs, same):
        assert_rule(ours.grad, ref.grad, t.grad, torch.bfloat16, f"{path} {name}", GRAD_ATOL_EPS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_backward_of_some_inputs(device, activation):
    """A frozen weight (LoRA, fine-tuning the bias), or only the weight: only the asked-for gradients."""
    x, w, b, _ = make((6,), 64, 32, activation, "bias", torch.bfloat16, device)
    for trained in ((x,), (w,), (b,), (x, b)):
        for t in (x, w, b):
            t.grad = None
            t.requires_grad_(any(t is u for u in trained))
        llmk.linear(x, w, b, None, activation).float().square().sum().backward()
        for t in (x, w, b):
            assert (t.grad is not None) == any(t is u for u in trained)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ["none", "silu_mul"])
def test_transposed_and_strided_views(device, activation):
    """The layouts the backward feeds the GEMM: x as a 2-d transposed view (stride(0) == 1), the
    weight as a transposed [K, N] tensor's view; and x rows strided (a slice of a wider tensor)."""
    m, k, n, dtype = 16, 64, 48, torch.bfloat16
    x, w, b, _ = make((m,), k, n, activation, "bias", dtype, device)
    want = composed(*map(f64, (x, w, b, None)), activation, exact=True)
    theirs = composed(x, w, b, None, activation)
    x_t = x.t().contiguous().t()  # [m, k], stride (1, m)
    w_t = w.t().contiguous().t()  # [n, k], stride (1, n)
    wide = torch.randn(m, k + 24, device=device, dtype=dtype)
    wide[:, 8:8 + k] = x
    x_strided = wide[:, 8:8 + k]  # row stride k + 24, 16-byte aligned start
    for xv, wv, what in ((x_t, w, "x transposed"), (x, w_t, "weight transposed"), (x_t, w_t, "both transposed"),
                         (x_strided, w, "x strided rows")):
        assert_rule(llmk.linear(xv, wv, b, None, activation), want, theirs, dtype, what)


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
def test_every_m_to_256(dtype):
    """Every M from 1 to 256 on the automatic path (the small-M kernel, the Hopper kernel's
    one-block clusters to M = 128 and two-block ones above, split along K), with K = 4104 (65
    k steps: pieces of unequal length, the last one short) and 520 outputs (three tiles, the
    last partial), bias and residual; each M's rows a prefix of one x."""
    k, n = 4104, 520
    x, w, b, r = make((256,), k, n, "none", "bias_residual", dtype, "cuda")
    want = composed(*map(f64, (x, w, b, r)), "none", exact=True)
    theirs = composed(x, w, b, r, "none")
    for m in range(1, 257):
        got = llmk.linear(x[:m], w, b, r[:m])
        assert_rule(got, want[:m], theirs[:m], dtype, f"M = {m}")


@requires_cuda
def test_split_k_call_replays_in_a_cuda_graph():
    """128 rows against a 4096 x 4096 weight: the Hopper kernel (an sm_90 GPU) runs it split-K,
    its partial sums in stream-ordered scratch memory, which a graph capture takes over; the
    replay with new x matches an eager call bit for bit (other GPUs: the same check on their
    path)."""
    x = torch.randn(128, 4096, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(4096, 4096, device="cuda") / 64).to(torch.bfloat16)
    r = torch.randn(128, 4096, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the capture, as torch.cuda.graph wants
        llmk.linear(x, w, None, r, "gelu")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = llmk.linear(x, w, None, r, "gelu")
    for _ in range(2):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got, llmk.linear(x, w, None, r, "gelu"))


@pytest.mark.parametrize("device", DEVICES)
def test_residual_is_not_modified_and_zero_rows(device):
    x, w, b, r = make((4,), 64, 32, "none", "bias_residual", torch.bfloat16, device)
    r_before = r.clone()
    llmk.linear(x, w, b, r)
    assert torch.equal(r, r_before)
    empty = llmk.linear(x[:0], w, b)
    assert empty.shape == (0, 32)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    """Forward and backward of a SwiGLU MLP block on llmk.linear under torch.compile."""
    backend = "inductor" if device == "cuda" else "aot_eager"
    dtype, d, ffn = torch.bfloat16, 64, 96

    def mlp(x, w_gate_up, w_down, b_down):
        h = llmk.linear(x, w_gate_up, None, None, "silu_mul")
        return llmk.linear(h, w_down, b_down, x)

    x = torch.randn(2, 5, d, device=device, dtype=dtype, requires_grad=True)
    w1 = (torch.randn(2 * ffn, d, device=device) / d**0.5).to(dtype).requires_grad_()
    w2 = (torch.randn(d, ffn, device=device) / ffn**0.5).to(dtype).requires_grad_()
    b2 = torch.randn(d, device=device, dtype=dtype, requires_grad=True)
    torch._dynamo.reset()
    out = torch.compile(mlp, fullgraph=True, backend=backend)(x, w1, w2, b2)
    dy = torch.randn_like(out)
    out.backward(dy)
    leaves = [t.detach().clone().requires_grad_() for t in (x, w1, w2, b2)]
    eager = mlp(*leaves)
    eager.backward(dy)
    # The same llmk kernels run compiled and eager; the compiled graph may add the residual's
    # gradient into dx in another order (a bf16 rounding step of difference).
    torch.testing.assert_close(out, eager, rtol=2e-2, atol=2e-2)
    for t, e in zip((x, w1, w2, b2), leaves):
        torch.testing.assert_close(t.grad, e.grad, rtol=2e-2, atol=2e-2)


def test_nn_linear_is_a_drop_in():
    dtype = torch.bfloat16
    ref = torch.nn.Linear(64, 48, dtype=dtype)
    ours = llmk.nn.Linear(64, 48, dtype=dtype)
    assert isinstance(ours, torch.nn.Linear)
    assert [n for n, _ in ours.named_parameters()] == ["weight", "bias"]
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(3, 7, 64, dtype=dtype, requires_grad=True)
    out = ours(x)
    want = F.linear(*map(f64, (x, ref.weight, ref.bias)))
    assert_rule(out, want, ref(x), dtype, "nn.Linear")
    out.float().square().sum().backward()
    assert x.grad.shape == x.shape and ours.weight.grad.shape == (48, 64) and ours.bias.grad.shape == (48,)
    no_bias = llmk.nn.Linear(64, 48, bias=False, dtype=dtype)
    assert no_bias.bias is None and no_bias(x).shape == (3, 7, 48)
    shared = llmk.nn.Linear.from_linear(ref)
    assert shared.weight is ref.weight and shared.bias is ref.bias
    assert torch.equal(shared(x), out)
    assert llmk.nn.Linear.from_linear(torch.nn.Linear(64, 8, bias=False)).bias is None


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    def t(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=device, dtype=dtype)

    x, w = t(4, 64), t(32, 64)
    with pytest.raises(RuntimeError, match="float32"):
        llmk.linear(x.float(), w.float())
    with pytest.raises(RuntimeError, match="gemm"):  # mixed operand dtypes
        llmk.linear(x, w.half())
    with pytest.raises(RuntimeError, match="gemm"):  # K of x and weight differ
        llmk.linear(x, t(32, 72))
    with pytest.raises(RuntimeError, match="gemm"):  # rows of 3 bf16: not 16-byte aligned
        llmk.linear(t(4, 3), t(32, 3))
    with pytest.raises(RuntimeError, match="gemm"):  # bias of the wrong length
        llmk.linear(x, w, t(31))
    with pytest.raises(RuntimeError, match="gemm"):  # residual of the wrong shape
        llmk.linear(x, w, None, t(4, 31))
    with pytest.raises(RuntimeError, match="linear: activation must be"):
        llmk.linear(x, w, None, None, "relu")
    with pytest.raises(RuntimeError, match="linear: weight has 1 dims"):
        llmk.linear(x, t(64))
    with pytest.raises(RuntimeError, match="even number"):
        llmk.linear(x, t(33, 64), None, None, "silu_mul")
    with pytest.raises(RuntimeError, match="float64"):
        llmk.linear(x.double(), w.double())
