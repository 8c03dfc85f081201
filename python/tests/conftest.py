import math
import os
import random

import pytest
import torch

import llmk  # noqa: F401  (registers torch.ops.llmk)

HAS_CUDA = torch.cuda.is_available() and llmk._C.cuda_device_count() > 0
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device: GPU test skipped")
# Every test runs on both; without a GPU the CUDA cases are collected and skipped with the
# reason, so a run reports what it did not test.
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# Output rounding step of each dtype: llmk rounds once from fp32 math, so outputs sit within
# about one step of a float64 reference.
RTOL = {torch.float32: 2e-5, torch.float16: 2 / 1024, torch.bfloat16: 2 / 128}


def pytest_configure(config):
    seed = int(os.environ.get("LLMK_TEST_SEED", random.randrange(2**31)))
    print(f"[llmk tests] random seed {seed} (set LLMK_TEST_SEED to repeat)")
    torch.manual_seed(seed)


def assert_close(got: torch.Tensor, want: torch.Tensor, rtol: float, what: str = "output",
                 atol_scale: float = 1e-3, atol: float = None):
    """|got - want| <= atol + rtol*|want| elementwise; NaN fails. atol defaults to
    atol_scale*rtol*max|want|; gradients (differences of larger terms) pass a larger one."""
    got = got.double().cpu()
    want = want.double().cpu()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if atol is None:
        atol = atol_scale * rtol * want.abs().max().item() if want.numel() else 0.0
    bad = ~((got - want).abs() <= atol + rtol * want.abs())
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {bad.numel()} elements out of tolerance (rtol {rtol}); "
        f"max abs err {(got - want).abs().nan_to_num(float('inf')).max().item():.3g}")


def rmsnorm_ref(x, w, eps, offset=0.0):
    """The definition, in float64."""
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * (offset + w.double())


def dx_term_scale(x, w, dy, eps, offset=0.0):
    """max |rstd * dy * (offset + w)|: the scale of the terms whose difference is dx."""
    rstd = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + eps)
    return (rstd * dy.double() * (offset + w.double())).abs().max().item()


def gelu_ref(z: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU of a float64 tensor without cancellation: F.gelu's 1 + erf / 1 + tanh lose every
    digit for z << 0 even in float64 (~2e-5 relative at z = -7, all of it below -8), so the
    erf form goes through erfc and the tanh form through sigmoid(2u)."""
    if approximate == "none":
        return 0.5 * z * torch.special.erfc(-z / math.sqrt(2.0))
    return z * torch.sigmoid(2 * 0.7978845608028654 * (z + 0.044715 * z**3))


def poison_allocator(like: torch.Tensor, blocks: int = 8):
    """Leaves NaN-filled blocks of like's size in the CUDA caching allocator's free pool, so the
    next outputs an op allocates start as NaN (an element the op does not write stays NaN)."""
    if like.is_cuda:
        pool = [torch.full((like.numel() * like.element_size() // 4 + 1024,), float("nan"), device=like.device)
                for _ in range(blocks)]
        del pool


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, float("nan"))


def f64(t):
    """A float64 leaf copy of t (None stays None), keeping whether it wants a gradient."""
    return None if t is None else t.detach().double().requires_grad_(t.requires_grad)


def assert_flash_rule(got, want, theirs, dtype, what, atol_eps, scale=None):
    """FlashAttention's rule: max|got - want| <= 2 max|theirs - want| + atol (NaN fails), atol =
    atol_eps rounding steps of `dtype` at max|want| (or at `scale` where the caller names the
    magnitude: a gradient that is zero by identity has none of its own); empty tensors pass."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if scale is None:
        scale = want.abs().max().item() if want.numel() else 0.0
    ours = (got.double() - want).abs().max().item() if want.numel() else 0.0
    ref_err = (theirs.double() - want).abs().max().item() if want.numel() else 0.0
    atol = atol_eps * torch.finfo(dtype).eps * scale
    assert ours <= 2 * ref_err + atol, (f"{what}: max error {ours:.3g} > 2 x PyTorch's {ref_err:.3g} + {atol:.3g} "
                                        f"(max|ref| {scale:.3g})")
