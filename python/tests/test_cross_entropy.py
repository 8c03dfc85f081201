"""llmk.cross_entropy (torch.ops.llmk.cross_entropy / cross_entropy_backward /
cross_entropy_grad_): values and gradients against PyTorch's cross-entropy in float64 on CPU and
CUDA, every reduction, ignore_index, label smoothing, the z-loss term, the gradient written over
the logits (grad_in_logits) against the default path, and bad arguments. The kernels' own cases
(vocab sizes up to 262144, strided and in-place gradients, masked rows, out-of-range
targets) are in tests/cpp/cross_entropy_test.cc."""

import pytest
import torch
import torch.nn.functional as F

import llmk
from conftest import DEVICES, DTYPES, RTOL, assert_close


def reference(logits, target, ignore_index, label_smoothing, z_loss, reduction):
    z = logits.double().reshape(-1, logits.shape[-1])
    loss = F.cross_entropy(z, target.reshape(-1), ignore_index=ignore_index, label_smoothing=label_smoothing,
                           reduction="none").view(target.shape)
    lse = torch.logsumexp(z, -1).view(target.shape)
    loss = loss + torch.where(target == ignore_index, 0.0, z_loss * lse**2)
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / (target != ignore_index).sum()
    return loss


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("vocab", [1, 37, 4096, 32000])
def test_matches_pytorch(device, dtype, reduction, vocab):
    logits = (torch.randn(2, 9, vocab, device=device) * 4).to(dtype).requires_grad_()
    target = torch.randint(0, vocab, (2, 9), device=device)
    target[0, 3] = -100
    args = (-100, 0.1, 1e-4)
    loss = llmk.cross_entropy(logits, target, *args[:2], reduction=reduction, z_loss=args[2])
    z = logits.detach().double().requires_grad_()
    want = reference(z, target, *args, reduction)
    assert loss.dtype == torch.float32 and loss.shape == want.shape
    assert_close(loss, want, 1e-5, "loss", atol=1e-5 * (1 + want.abs().max().item()))
    dy = torch.randn_like(want)
    loss.backward(dy.float())
    want.backward(dy)
    # Each gradient is a difference of terms of the row's upstream gradient (p (1 + 2 z_loss
    # lse), 1 - eps at the target): its error is relative to that scale, not to the result.
    row_scale = dy.abs().max().item() / ((target != -100).sum().item() if reduction == "mean" else 1)
    atol = 2 * RTOL[dtype] * max(z.grad.abs().max().item(), row_scale)
    assert_close(logits.grad, z.grad, 2 * RTOL[dtype], "dlogits", atol=atol)


@pytest.mark.parametrize("device", DEVICES)
def test_lse_and_all_ignored(device):
    logits = torch.randn(5, 100, device=device)
    target = torch.full((5,), 7, device=device)
    loss, lse = llmk.cross_entropy(logits, target, reduction="none", return_lse=True)
    assert_close(lse, torch.logsumexp(logits.double(), -1), 1e-5, "lse")
    ignored = torch.full((5,), -100, device=device)
    assert torch.isnan(llmk.cross_entropy(logits, ignored))  # 0 / 0, as PyTorch
    assert torch.equal(llmk.cross_entropy(logits, ignored, reduction="none"), torch.zeros(5, device=device))


def test_bad_arguments():
    logits, target = torch.randn(4, 10), torch.randint(0, 10, (4,))
    with pytest.raises(ValueError, match="reduction must be one of"):
        llmk.cross_entropy(logits, target, reduction="avg")
    with pytest.raises(RuntimeError, match=r"cross_entropy: target\[1\] = 10 is out of range for 10 classes"):
        llmk.cross_entropy(logits, torch.tensor([0, 10, 1, 2]))
    with pytest.raises(RuntimeError, match="cross_entropy: logits is float64"):
        llmk.cross_entropy(logits.double(), target)


def _grad_case(device, dtype, vocab):
    """A leaf x (float32 [2, 9, vocab] cast to dtype) and target rows with two ignored ones: the
    logits are x.clone(), a non-leaf that grad_in_logits may overwrite (clone passes the gradient
    through unchanged, so x.grad is the logits' gradient)."""
    x = (torch.randn(2, 9, vocab, device=device) * 4).to(dtype).requires_grad_()
    target = torch.randint(0, vocab, (2, 9), device=device)
    target[0, 3] = target[1, 8] = -100
    return x, target


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("vocab", [37, 4096])
def test_grad_in_logits_matches_default(device, dtype, reduction, vocab):
    x, target = _grad_case(device, dtype, vocab)
    kwargs = dict(ignore_index=-100, label_smoothing=0.1, reduction=reduction, z_loss=1e-4)
    dy = torch.rand((), device=device) + 0.5  # an upstream scale other than 1
    want, want_lse = llmk.cross_entropy(x, target, return_lse=True, **kwargs)
    (want_grad,) = torch.autograd.grad(want, x, dy)

    logits = x.clone()
    loss, lse = llmk.cross_entropy(logits, target, return_lse=True, grad_in_logits=True, **kwargs)
    assert_close(loss, want, 1e-6, "loss", atol=1e-6)
    assert_close(lse, want_lse, 1e-6, "lse", atol=1e-6)
    # The forward wrote the gradient of the rows' sum (scale 1) over the logits.
    scale = dy / (target != -100).sum() if reduction == "mean" else dy
    written = logits.detach().clone()
    # Rounded to the dtype once before scaling and once after: two steps where the default path rounds once.
    atol = 1e-2 * RTOL[dtype] * want_grad.abs().max().item()
    assert_close(written.double() * scale.double(), want_grad, 2 * RTOL[dtype], "written gradient", atol=atol)
    loss.backward(dy)
    assert_close(x.grad, want_grad, 2 * RTOL[dtype], "dlogits", atol=atol)
    assert torch.equal(logits.detach(), x.grad), "the logits' buffer does not hold the scaled gradient"
    z = x.detach().double().requires_grad_()
    reference(z, target, -100, 0.1, 1e-4, reduction).backward(dy.double())
    row_scale = dy.item() / ((target != -100).sum().item() if reduction == "mean" else 1)
    atol = 2 * RTOL[dtype] * max(z.grad.abs().max().item(), row_scale)
    assert_close(x.grad, z.grad, 2 * RTOL[dtype], "dlogits vs float64", atol=atol)


@pytest.mark.parametrize("device", DEVICES)
def test_grad_in_logits_all_ignored(device):
    x, _ = _grad_case(device, torch.float32, 50)
    target = torch.full((2, 9), -100, device=device)
    loss = llmk.cross_entropy(x.clone(), target, grad_in_logits=True)
    assert torch.isnan(loss)  # 0 / 0, as the default path
    loss.backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("device", DEVICES)
def test_grad_in_logits_without_grad_is_the_default(device):
    logits = torch.randn(7, 300, device=device)
    target = torch.randint(0, 300, (7,), device=device)
    kept = logits.clone()
    want = llmk.cross_entropy(logits, target, label_smoothing=0.2)
    assert torch.equal(llmk.cross_entropy(logits, target, label_smoothing=0.2, grad_in_logits=True), want)
    with torch.no_grad():
        graph_logits = logits.clone().requires_grad_().clone()
        kept_graph = graph_logits.clone()
        assert torch.equal(llmk.cross_entropy(graph_logits, target, label_smoothing=0.2, grad_in_logits=True), want)
    assert torch.equal(logits, kept) and torch.equal(graph_logits, kept_graph)


@pytest.mark.parametrize("device", DEVICES)
def test_grad_in_logits_compiles(device):
    x, target = _grad_case(device, torch.bfloat16, 64)
    kwargs = dict(label_smoothing=0.1, z_loss=1e-4)
    (want_grad,) = torch.autograd.grad(llmk.cross_entropy(x, target, **kwargs), x)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: llmk.cross_entropy(x.clone(), target, grad_in_logits=True, **kwargs),
                             backend="aot_eager", fullgraph=True)
    compiled(x).backward()
    atol = 1e-2 * RTOL[torch.bfloat16] * want_grad.abs().max().item()
    assert_close(x.grad, want_grad, 2 * RTOL[torch.bfloat16], "dlogits", atol=atol)


def test_grad_in_logits_rejections():
    """Each refused case raises naming llmk.cross_entropy and the argument, and leaves the logits as
    they were."""
    x, target = _grad_case("cpu", torch.float32, 10)
    y = x.clone()  # a non-leaf with the leaf's values
    cases = [
        (x.clone(), dict(reduction="none"), ValueError, "grad_in_logits=True needs reduction 'mean' or 'sum'"),
        (x, {}, RuntimeError, "writes the gradient over logits, which is a leaf"),
        (x[:, 1:], {}, RuntimeError, "writes the gradient over logits, which is a leaf"),
        (y[0].t(), dict(target=torch.randint(0, 9, (10,))), ValueError, "contiguous in the vocab dimension"),
        (y[:, :5], dict(target=target[:, :5]), ValueError, "flatten into rows of one stride"),
        (y.double(), {}, RuntimeError, "cross_entropy_grad_: logits is float64"),
        (y, dict(target=target.masked_fill(target == -100, 10)), RuntimeError, r"target\[3\] = 10 is out of range"),
    ]
    for logits, kwargs, error, message in cases:
        kept = logits.detach().clone()
        kwargs = dict(dict(target=target), **kwargs)
        with pytest.raises(error, match=message):
            llmk.cross_entropy(logits, grad_in_logits=True, **kwargs)
        assert torch.equal(logits.detach(), kept), f"{message}: the logits were written"


def test_grad_in_logits_autograd_refusals():
    x, target = _grad_case("cpu", torch.float32, 10)
    loss = llmk.cross_entropy(x.clone(), target, grad_in_logits=True)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="llmk.cross_entropy: with grad_in_logits=True .* a second backward"):
        loss.backward()
    # A backward that saved the logits' values before they were overwritten refuses to run.
    logits = x.clone()
    square = (logits * logits).sum()
    llmk.cross_entropy(logits, target, grad_in_logits=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        square.backward()
