"""torch.ops.llmk.softmax (softmax and log_softmax) and softmax_backward: values against the
float64 definition on CPU and CUDA (short, long and two-pass rows, long rows split over a
thread-block cluster on sm_90 at few rows and at many, forward and backward, scales,
magnitude 1e4, masked entries and rows, strided rows), autograd against float64 autograd,
opcheck, torch.compile(fullgraph=True), bad inputs."""

import pytest
import torch

import llmk
from conftest import DEVICES, DTYPES, RTOL, assert_close


def softmax_ref(x, scale, log):
    u = x.double() * scale
    y = torch.log_softmax(u, -1) if log else torch.softmax(u, -1)
    masked = torch.isneginf(u).all(-1, keepdim=True)  # our documented rule for fully masked rows
    return torch.where(masked, torch.full_like(y, float("-inf") if log else 0.0), y)


def ours(x, scale, log):
    return llmk.log_softmax(x, scale) if log else llmk.softmax(x, scale)


def check(y, ref, dtype, log):
    if log:  # -inf (also from fp16 overflow) must match; finite values carry an error relative to their size
        assert torch.equal(torch.isneginf(y.cpu()), torch.isneginf(ref.to(dtype).cpu()))
        finite = torch.isfinite(ref.to(dtype))
        y, ref = y[finite], ref[finite]
        assert_close(y, ref, RTOL[dtype], atol=RTOL[dtype] * max(1.0, ref.abs().max().item() if ref.numel() else 1))
    else:  # float16 probabilities below 6e-5 are subnormal: an absolute rounding step of 6e-8
        atol = RTOL[dtype] * 1e-3 * ref.abs().max().item() + (2.0**-24 if dtype == torch.float16 else 0.0)
        assert_close(y, ref, RTOL[dtype], atol=atol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 5, 1000), (17, 4096), (4, 32000), (2, 65544), (1, 262144)])
def test_matches_definition(device, dtype, log, shape):
    x = torch.randn(shape, device=device, dtype=dtype) * 3
    y = ours(x, 1.0, log)
    assert y.dtype == dtype and y.shape == x.shape
    check(y, softmax_ref(x, 1.0, log), dtype, log)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
def test_scale_magnitude_masking_strides(device, dtype, log):
    scores = torch.randn(4, 8, 3 * 512, device=device, dtype=dtype)
    x = scores[..., 512:1024]  # strided rows
    check(ours(x, 0.125, log), softmax_ref(x, 0.125, log), dtype, log)
    big = torch.randn(6, 2048, device=device, dtype=dtype) * 1e4
    check(ours(big, 1.0, log), softmax_ref(big, 1.0, log), dtype, log)
    masked = torch.randn(5, 300, device=device, dtype=dtype)
    masked[:, ::3] = float("-inf")
    masked[1] = float("-inf")  # a fully masked row: zeros (log: -inf), never NaN
    y = ours(masked, 0.5, log)
    assert not torch.isnan(y).any()
    check(y, softmax_ref(masked, 0.5, log), dtype, log)
    check(ours(x, -2.0, log), softmax_ref(x, -2.0, log), dtype, log)  # a negative scale


# Vocabulary-sized rows at 1-16 rows: on sm_90 (132 SMs) each row is split over a cluster of
# 8 blocks (src/softmax/softmax_cluster_launch.cuh: rows < 2 x SMs and slices of >= 1024 16-byte vectors);
# 128264 columns leave the last block a shorter slice. From 2 x SMs rows, rows past 2048
# vectors take min(8, ceil(V / 2048)) blocks: 300 x 32000 bf16 2, 280 x 128264 8.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape", [(1, 128256), (16, 128256), (1, 151936), (16, 151936), (3, 128264),
                                   (300, 32000), (280, 128264)])
def test_vocabulary_rows(device, dtype, log, shape):
    x = torch.randn(shape, device=device, dtype=dtype) * 3
    x[:, 3::5] = float("-inf")
    check(ours(x, 0.37, log), softmax_ref(x, 0.37, log), dtype, log)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
def test_vocabulary_rows_strided_masked(device, dtype, log):
    wide = torch.randn(16, 151936 + 72, device=device, dtype=dtype) * 3
    x = wide[:, :151936]  # strided rows (16-byte aligned)
    check(ours(x, -1.5, log), softmax_ref(x, -1.5, log), dtype, log)  # a negative scale
    x[:, 1::7] = float("-inf")
    x[2] = float("-inf")  # a fully masked row: zeros (log: -inf), never NaN
    y = ours(x, 1.0, log)
    assert not torch.isnan(y).any()
    check(y, softmax_ref(x, 1.0, log), dtype, log)


# (16, 128256) and (300, 32000): on sm_90 (132 SMs) the backward splits each row over a
# cluster, 8 blocks at few rows and 4 at many (src/softmax/softmax_cluster_launch.cuh).
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("shape", [(6, 3, 700), (16, 128256), (300, 32000)])
def test_autograd_matches_float64(device, dtype, log, shape):
    x = (torch.randn(shape, device=device, dtype=dtype) * 2).requires_grad_()
    dy = torch.randn(shape, device=device, dtype=dtype)
    ours(x, 0.3, log).backward(dy)
    x64 = x.detach().double().requires_grad_()
    softmax_ref(x64, 0.3, log).backward(dy.double())
    term = 0.3 * dy.double().abs().max().item()
    assert_close(x.grad, x64.grad, RTOL[dtype], "dx", atol=RTOL[dtype] * term)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    backend = "inductor" if device == "cuda" else "aot_eager"

    def attention_weights(q, k):
        return (llmk.softmax(q @ k.t(), 0.125) + llmk.log_softmax(q @ k.t()).exp()).square().sum()

    q = torch.randn(16, 32, device=device, requires_grad=True)
    k = torch.randn(24, 32, device=device)
    out = torch.compile(attention_weights, fullgraph=True, backend=backend)(q, k)
    out.backward()
    q64 = q.detach().double().requires_grad_()
    s = q64 @ k.double().t()
    want = (torch.softmax(s * 0.125, -1) + torch.softmax(s, -1)).square().sum()
    want.backward()
    assert_close(out.detach().reshape(1), want.detach().reshape(1), 1e-4)
    assert_close(q.grad, q64.grad, 1e-4, "dq", atol_scale=0.05)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    x = torch.randn(4, 64, device=device)
    with pytest.raises(RuntimeError, match="softmax: scale must be finite"):
        llmk.softmax(x, float("inf"))
    with pytest.raises(RuntimeError, match="softmax_backward: dy has dtype float16, expected float32"):
        llmk.softmax_backward(x.half(), x)
    with pytest.raises(RuntimeError, match="softmax: x is float64; llmk takes float32, float16, bfloat16"):
        llmk.softmax(x.double())
    assert llmk.softmax(x[:0]).shape == (0, 64)
    assert llmk.log_softmax(x[:, :0]).shape == (4, 0)
