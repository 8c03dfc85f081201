"""llmk.cross_entropy (torch.ops.llmk.cross_entropy / cross_entropy_backward): values and
gradients against PyTorch's cross-entropy in float64 on CPU and CUDA, every reduction,
ignore_index, label smoothing, the z-loss term, and bad arguments. The kernels' own cases
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
