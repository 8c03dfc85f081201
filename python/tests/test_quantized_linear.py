"""llmk.quantized_linear and its format (torch.ops.llmk.quantized_linear, dequantize_weight,
quantize_weight_, pack_quantized_weight; include/llmk/quantized_gemm.h defines the format).

- The layout: codes packed by llmk are unpacked here by an independent reading of the
  header's definition (word j = 4t + i of a row's 512-bit block b holds k = 128b + 32i + 8t + e
  for int4, nibble p(e); 64b + 32(i/2) + 8t + 4(i%2) + e for int8, byte e).
- quantize_weight: the codes, scales and zeros of round to nearest, recomputed here in float64.
- dequantize_weight: exactly ``((q - z) * s)`` in the scales' dtype, CPU and CUDA.
- quantized_linear against ``x · Wᵀ`` in float64 on the dequantized weight W, with the
  FlashAttention rule (our max error at most 2x that of torch's F.linear on W in the same
  dtype, plus a twentieth of a rounding step): int4 group 128, int4 per channel, int8 per
  channel, int8 group 64, symmetric and with zero points; M over the streaming kernel's token
  tiles (1-8, 16, 32, 64), its 64-row chunks (65, 130, 256) and the dequantize + GEMM path
  (257, 300); odd N; strided x rows; bias; both CUDA paths forced; float16 and bfloat16.
- Gradients of x and bias; bad inputs name the op and the argument.
"""

import pytest
import torch
import torch.nn.functional as F

import llmk
from conftest import assert_flash_rule, poison_allocator, requires_cuda

HALF = [torch.float16, torch.bfloat16]
ATOL_EPS = 0.05
# (bits, group_size or None for per channel, symmetric)
FORMATS = [(4, 128, True), (4, 128, False), (4, None, True), (8, None, True), (8, 64, False)]
FORMAT_IDS = ["int4_g128", "int4_g128_zeros", "int4_channel", "int8_channel", "int8_g64_zeros"]


def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [N, K] (int64) from llmk's packed layout, read from the header's definition."""
    n, words = packed.shape
    k = words * 32 // bits
    w = packed.cpu().to(torch.int64) & 0xFFFFFFFF
    codes = torch.empty(n, k, dtype=torch.int64)
    for j in range(words):
        block, word = divmod(j, 16)
        t, i = divmod(word, 4)
        for e in range(32 // bits):
            if bits == 4:
                kk = 128 * block + 32 * i + 8 * t + e
                shift = 4 * (e // 2 if e % 2 == 0 else e // 2 + 4)
            else:
                kk = 64 * block + 32 * (i // 2) + 8 * t + 4 * (i % 2) + e
                shift = 8 * e
            codes[:, kk] = (w[:, j] >> shift) & ((1 << bits) - 1)
    return codes


def dequant_ref(codes, scales, zeros, bits, group):
    """(q - z) * s in the scales' dtype: (q - z) exact, one rounded multiply."""
    z = zeros.to(torch.int64) if zeros is not None else torch.full_like(scales, 1 << (bits - 1), dtype=torch.int64)
    zk = z.cpu().repeat_interleave(group, dim=1)
    sk = scales.cpu().repeat_interleave(group, dim=1)
    return (codes - zk).to(scales.dtype) * sk


def exact_weight(packed, scales, zeros, bits, group):
    """(q - z) * s in float64, unrounded: the quantized model's weight. The reference of the
    forward tests: the int4 streaming kernel multiplies by it (each group's fp32 sum of (q - z) x
    times s), the other paths by dequantize_weight's rounding of it; torch's F.linear on the
    rounded weight stays the yardstick."""
    q_minus_z = llmk.dequantize_weight(packed, torch.ones_like(scales), zeros, bits, group)  # exact
    return q_minus_z.double() * scales.double().repeat_interleave(group, dim=1)


def quantized(n, k, dtype, bits, group, symmetric, device="cpu", scale=1.0):
    w = torch.randn(n, k, dtype=torch.float32) * scale / k**0.5
    packed, scales, zeros = llmk.quantize_weight(w.to(dtype), bits, group, symmetric=symmetric)
    return [t if t is None else t.to(device) for t in (packed, scales, zeros)], w


@pytest.mark.parametrize("bits", [4, 8])
def test_pack_layout(bits):
    codes = torch.randint(0, 1 << bits, (5, 384 if bits == 4 else 192), dtype=torch.uint8)
    packed = llmk.pack_quantized_weight(codes, bits)
    assert packed.dtype == torch.int32 and packed.shape == (5, codes.shape[1] * bits // 32)
    assert torch.equal(unpack(packed, bits), codes.to(torch.int64))


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("dtype", HALF)
def test_quantize_is_round_to_nearest(fmt, dtype):
    bits, group, symmetric = fmt
    n, k = 6, 256
    w = (torch.randn(n, k) * 0.1).to(dtype)
    w[2, :128] = 0  # an all-zero group gets scale 1
    packed, scales, zeros = llmk.quantize_weight(w, bits, group, symmetric=symmetric)
    g = k if group is None else group
    assert scales.shape == (n, k // g) and scales.dtype == dtype
    assert (zeros is None) == symmetric
    codes = unpack(packed, bits)
    wd = w.double().view(n, k // g, g)
    lo, hi = wd.amin(-1).clamp(max=0), wd.amax(-1).clamp(min=0)
    qmax = (1 << bits) - 1
    s_exact = torch.maximum(hi, -lo) / ((1 << (bits - 1)) - 1) if symmetric else (hi - lo) / qmax
    s = s_exact.to(dtype).double()
    s = torch.where(s > 0, s, torch.ones_like(s))
    assert torch.equal(scales.double(), s)
    z = torch.full_like(s, 1 << (bits - 1)) if symmetric else torch.clamp(torch.round(-lo / s), 0, qmax)
    if not symmetric:
        assert torch.equal(zeros.double(), z)
    want = torch.clamp(torch.round(wd / s[..., None]) + z[..., None], 0, qmax).view(n, k)
    assert torch.equal(codes.double(), want)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("dtype", HALF)
def test_dequantize_exact(device, fmt, dtype):
    bits, group, symmetric = fmt
    (packed, scales, zeros), _ = quantized(40, 512, dtype, bits, group, symmetric, device)
    got = llmk.dequantize_weight(packed, scales, zeros, bits, group or 512)
    assert got.dtype == dtype and got.shape == (40, 512) and got.device.type == device
    want = dequant_ref(unpack(packed, bits), scales, zeros, bits, group or 512)
    assert torch.equal(got.cpu(), want)


def check_linear(m_lead, n, k, dtype, fmt, device, bias=False, x_stride=None):
    bits, group, symmetric = fmt
    group = group or k
    (packed, scales, zeros), _ = quantized(n, k, dtype, bits, group, symmetric, device)
    if x_stride is None:
        x = torch.randn(*m_lead, k, device=device, dtype=dtype)
    else:  # rows x_stride elements apart
        x = torch.randn(*m_lead, x_stride, device=device, dtype=dtype)[..., :k]
    b = torch.randn(n, device=device, dtype=dtype) if bias else None
    poison_allocator(x)
    out = llmk.quantized_linear(x, packed, scales, zeros, bits, group, b)
    assert out.shape == (*m_lead, n) and out.dtype == dtype and out.device.type == device
    w = llmk.dequantize_weight(packed, scales, zeros, bits, group)
    want = F.linear(x.double(), exact_weight(packed, scales, zeros, bits, group), None if b is None else b.double())
    theirs = F.linear(x, w, b)
    assert_flash_rule(out, want, theirs, dtype, f"quantized_linear {tuple(x.shape)} x [{n}, {k}] {bits}-bit "
                                                f"g{group} {device}", ATOL_EPS)


CPU_SHAPES = [((1,), 24, 256), ((3,), 7, 128), ((2, 5), 40, 512), ((9,), 1, 384)]


@pytest.mark.parametrize("shape", CPU_SHAPES)
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("dtype", HALF)
def test_linear_cpu(shape, fmt, dtype):
    lead, n, k = shape
    if k % (fmt[1] or 64):
        pytest.skip("group does not divide K")
    check_linear(lead, n, k, dtype, fmt, "cpu", bias=True)


# M over the token tiles (1-8, 16, 32, 64), the 64-row chunks and the dequantize + GEMM path.
CUDA_M = [1, 3, 8, 16, 17, 33, 64, 65, 130, 256, 257, 300]


@requires_cuda
@pytest.mark.parametrize("m", CUDA_M)
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("dtype", HALF)
def test_linear_cuda(m, fmt, dtype):
    check_linear((m,), 200, 1024, dtype, fmt, "cuda", bias=m % 2 == 1)


@requires_cuda
@pytest.mark.parametrize("shape", [((1,), 14336, 4096), ((16,), 4096, 14336), ((4,), 6144, 4096),
                                   ((64,), 1024, 4096), ((2, 3), 13, 640), ((1,), 1, 128), ((1,), 128256, 256)])
@pytest.mark.parametrize("fmt", [FORMATS[0], FORMATS[3]], ids=["int4_g128", "int8_channel"])
def test_linear_cuda_model_shapes(shape, fmt):
    lead, n, k = shape
    check_linear(lead, n, k, torch.bfloat16, fmt, "cuda")


@requires_cuda
@pytest.mark.parametrize("path", ["stream", "dequant"])
@pytest.mark.parametrize("m", [1, 40, 300])
def test_linear_cuda_paths(path, m, monkeypatch):
    monkeypatch.setenv("LLMK_QUANTIZED_PATH", path)
    check_linear((m,), 520, 768, torch.bfloat16, FORMATS[1], "cuda", bias=True)
    check_linear((m,), 72, 384, torch.float16, FORMATS[4], "cuda", x_stride=392)


@requires_cuda
@pytest.mark.parametrize("m", [1, 40, 128])
def test_linear_cuda_sm90_path(m, monkeypatch):
    """LLMK_QUANTIZED_PATH=sm90: the Hopper kernel at any M it takes (int4 codes, K and the group
    multiples of 128, M <= 128), with zero points, per-channel scales and strided x; a call it
    cannot take (int8), or any call off an sm_90 GPU, is refused with a clear error."""
    monkeypatch.setenv("LLMK_QUANTIZED_PATH", "sm90")
    refused = "LLMK_QUANTIZED_PATH=sm90 cannot take this call"
    if torch.cuda.get_device_capability() != (9, 0):
        with pytest.raises(RuntimeError, match=refused):
            check_linear((m,), 520, 768, torch.bfloat16, FORMATS[1], "cuda")
        return
    check_linear((m,), 520, 768, torch.bfloat16, FORMATS[1], "cuda", bias=True)
    check_linear((m,), 300, 1024, torch.float16, FORMATS[2], "cuda", x_stride=1032)
    with pytest.raises(RuntimeError, match=refused):
        check_linear((m,), 72, 384, torch.float16, FORMATS[4], "cuda")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_linear_strided_rows(device):
    check_linear((5,), 48, 256, torch.bfloat16, FORMATS[0], device, x_stride=264)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_empty(device):
    (packed, scales, zeros), _ = quantized(8, 128, torch.bfloat16, 4, 128, True, device)
    out = llmk.quantized_linear(torch.randn(0, 128, device=device, dtype=torch.bfloat16), packed, scales, zeros, 4, 128)
    assert out.shape == (0, 8)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_gradients(device):
    dtype = torch.bfloat16
    (packed, scales, zeros), _ = quantized(24, 256, dtype, 4, 128, False, device)
    x = torch.randn(3, 256, device=device, dtype=dtype, requires_grad=True)
    b = torch.randn(24, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn(3, 24, device=device, dtype=dtype)
    dx, db = torch.autograd.grad(llmk.quantized_linear(x, packed, scales, zeros, 4, 128, b), (x, b), dy)
    w = llmk.dequantize_weight(packed, scales, zeros, 4, 128).double()
    assert_flash_rule(dx, dy.double() @ w, dy @ w.to(dtype), dtype, "dx", 1.0)
    torch.testing.assert_close(db.double(), dy.double().sum(0), rtol=1e-2, atol=1e-2)


def _bad(device):
    (packed, scales, zeros), _ = quantized(16, 256, torch.bfloat16, 4, 128, False, device)
    x = torch.randn(2, 256, device=device, dtype=torch.bfloat16)
    return x, packed, scales, zeros


BAD = [
    ("group 100", lambda x, p, s, z: (x, p, s, z, 4, 100), "group_size 100 must be a multiple of 128"),
    ("group 384", lambda x, p, s, z: (x, p, s, z, 4, 384), "that divides K = 256"),
    ("K not a multiple of 128", lambda x, p, s, z: (x[:, :200], p, s, z, 4, 128), "must be a multiple of 128"),
    ("packed shape", lambda x, p, s, z: (x, p[:, :16], s, z, 4, 128), "packed has shape [16, 16], expected [N, 32]"),
    ("packed dtype", lambda x, p, s, z: (x, p.to(torch.int64), s, z, 4, 128), "packed"),
    ("scales dtype", lambda x, p, s, z: (x, p, s.half(), z, 4, 128), "scales have dtype float16, expected bfloat16"),
    ("scales shape", lambda x, p, s, z: (x, p, s[:, :1], z, 4, 128), "scales have shape [16, 1], expected [16, 2]"),
    ("zeros dtype", lambda x, p, s, z: (x, p, s, z.to(torch.int32), 4, 128), "zeros"),
    ("bits 3", lambda x, p, s, z: (x, p, s, z, 3, 128), "bits must be 4 or 8, got 3"),
    ("x dtype", lambda x, p, s, z: (x.float(), p, s, z, 4, 128), "x has dtype float32"),
    ("bias shape", lambda x, p, s, z: (x, p, s, z, 4, 128, torch.zeros(15, dtype=x.dtype, device=x.device)), "bias"),
]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_inputs(device, case):
    _, make_args, needle = case
    args = make_args(*_bad(device))
    with pytest.raises((RuntimeError, ValueError), match="quantized_linear") as info:
        llmk.quantized_linear(*args)
    assert needle in str(info.value)


def test_bad_quantize_and_pack():
    with pytest.raises(ValueError, match="quantize_weight: group_size 100 must divide K = 256"):
        llmk.quantize_weight(torch.randn(4, 256), 4, 100)
    with pytest.raises((RuntimeError, ValueError), match="quantize_weight: group_size 64 must be a multiple of 128"):
        llmk.quantize_weight(torch.randn(4, 256), 4, 64)
    with pytest.raises(ValueError, match="pack_quantized_weight: codes must lie in"):
        llmk.pack_quantized_weight(torch.full((2, 128), 16), 4)
    with pytest.raises((RuntimeError, ValueError), match=r"pack_quantized_weight: codes\[1, 5\] = 20 does not fit"):
        codes = torch.zeros(2, 128, dtype=torch.uint8)
        codes[1, 5] = 20
        llmk.pack_quantized_weight(codes, 4)


@requires_cuda
def test_cuda_quantize_weight_roundtrips_through_the_host():
    w = torch.randn(32, 256, device="cuda", dtype=torch.bfloat16)
    packed, scales, zeros = llmk.quantize_weight(w, 4, 128)
    assert packed.is_cuda and scales.is_cuda and zeros is None
    ref = llmk.quantize_weight(w.cpu(), 4, 128)
    assert torch.equal(packed.cpu(), ref[0]) and torch.equal(scales.cpu(), ref[1])


def test_path_variable_is_checked(monkeypatch):
    monkeypatch.setenv("LLMK_QUANTIZED_PATH", "fast")
    x, p, s, z = _bad("cpu")
    with pytest.raises(RuntimeError, match="LLMK_QUANTIZED_PATH=fast is not one of auto, stream, dequant"):
        torch.ops.llmk.quantized_linear(x, p, s, z, 4, 128)

