"""llmk.quantization: the GPTQ / AWQ importers, QuantizedLinear and quantize_model.

- Importers: a random weight's codes, zero points and scales are packed here into GPTQ's and
  AWQ's checkpoint layouts by packers written from the formats' definitions (GPTQ: along K,
  value i of a word at bits i*bits, zero points stored minus 1 in v1; AWQ: along N, nibble j
  holding column ORDER[j] of 8, ORDER = [0, 2, 4, 6, 1, 3, 5, 7]); after the import,
  llmk.dequantize_weight must equal ``(q - z) * s`` computed by torch in the scales' dtype,
  exactly. An act-order g_idx (groups not contiguous in k) imports with an input order whose
  layer computes the checkpoint's weight; g_idx of unequal groups, bad shapes and out-of-range
  zero points are refused.
- QuantizedLinear: forward against ``x · Wᵀ + b`` in float64 on the dequantized weight (the
  FlashAttention rule of test_quantized_linear), from_linear, the state dict, the repr.
- quantize_model: a small model's output against the same model with the dequantized weights
  (float64), the report (names, reasons, bytes) and the skip rules (names, subclasses,
  DTensor weights, replaced forwards, hooks, dtypes, the format's K constraints).
"""

import copy
import io
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import llmk
from conftest import DEVICES, assert_flash_rule
from llmk.quantization import QuantizedLinear, QuantizedTensors, from_awq, from_gptq, parse_scheme, quantize_model

HALF = [torch.float16, torch.bfloat16]
ATOL_EPS = 0.05
ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


# -- a "true" quantized weight and independent packers of the checkpoint formats -------------


def true_weight(n, k, bits, group, dtype, symmetric=False):
    """Codes [N, K], zero points [N, K/G] and scales [N, K/G] (dtype), all random."""
    codes = torch.randint(0, 1 << bits, (n, k), dtype=torch.int64)
    if symmetric:
        zeros = torch.full((n, k // group), 1 << (bits - 1), dtype=torch.int64)
    else:
        zeros = torch.randint(1, 1 << bits, (n, k // group), dtype=torch.int64)  # v1 cannot store 0
    scales = (torch.rand(n, k // group) * 0.02 + 0.001).to(dtype)
    return codes, zeros, scales


def expected_weight(codes, zeros, scales, group):
    """(q - z) * s in the scales' dtype: (q - z) exact, one rounded multiply."""
    return expected_weight_by_group(codes, zeros, scales, torch.arange(codes.shape[1]) // group)


def act_order_g_idx(k, group):
    """An act-order checkpoint's g_idx: each group of `group` inputs scattered over k."""
    assert k // group >= 2, "one group has no order to shuffle"
    g_idx = (torch.arange(k, dtype=torch.int32) // group)[torch.randperm(k)]
    while torch.equal(g_idx, torch.arange(k, dtype=torch.int32) // group):
        g_idx = g_idx[torch.randperm(k)]
    return g_idx


def expected_weight_by_group(codes, zeros, scales, g_idx):
    """(q - z) * s with input k in group g_idx[k] (GPTQ's definition), in the scales' dtype."""
    g = g_idx.long()
    return (codes - zeros[:, g]).to(scales.dtype) * scales[:, g]


def to_int32(words):
    """int64 words in [0, 2^32) as the int32 of the same bits."""
    words = words & 0xFFFFFFFF
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_words(values, bits, dim):
    """int64 values packed into int32 words along dim: value i of each run of 32/bits at bits i*bits."""
    per = 32 // bits
    v = values.movedim(dim, -1)
    v = v.reshape(*v.shape[:-1], v.shape[-1] // per, per)
    words = sum(v[..., i] << (bits * i) for i in range(per))
    return to_int32(words).movedim(-1, dim)


def gptq_pack(codes, zeros, scales, bits, offset=1):
    """AutoGPTQ's tensors: qweight [K*bits/32, N], qzeros [K/G, N*bits/32], scales [K/G, N]."""
    qweight = pack_words(codes.t(), bits, 0)
    qzeros = pack_words(zeros.t() - offset, bits, 1)
    return qweight.contiguous(), qzeros.contiguous(), scales.t().contiguous()


def awq_pack_words(values):
    """AWQ's packing of int64 [R, N] into int32 [R, N/8]: nibble j holds column 8c + ORDER[j]."""
    r, n = values.shape
    v = values.reshape(r, n // 8, 8)
    return to_int32(sum(v[:, :, ORDER[j]] << (4 * j) for j in range(8)))


def awq_pack(codes, zeros, scales):
    """AutoAWQ GEMM's tensors: qweight [K, N/8], qzeros [K/G, N/8], scales [K/G, N]."""
    return awq_pack_words(codes.t().contiguous()), awq_pack_words(zeros.t().contiguous()), scales.t().contiguous()


def test_packers_against_hand_values():
    """The test's own packers, on values whose words are worked out by hand."""
    v = torch.arange(8, dtype=torch.int64)[None] + 1  # 1..8
    assert pack_words(v, 4, 1).item() == to_int32(torch.tensor(0x87654321)).item()
    assert awq_pack_words(v).item() == to_int32(torch.tensor(0x86427531)).item()  # cols 0,2,4,6,1,3,5,7 -> 1,3,5,..
    assert pack_words(torch.tensor([[255, 1, 2, 128]]), 8, 1).item() == to_int32(torch.tensor(0x800201FF)).item()


def check_import(t: QuantizedTensors, codes, zeros, scales, bits, group, dtype):
    n, k = codes.shape
    assert t.bits == bits and t.group_size == group
    assert t.packed.dtype == torch.int32 and t.packed.shape == (n, k * bits // 32)
    assert t.scales.dtype == dtype and t.scales.shape == (n, k // group)
    assert t.in_features == k and t.out_features == n
    got = llmk.dequantize_weight(t.packed, t.scales, t.zeros, bits, group)
    want = expected_weight(codes, zeros, scales.to(dtype), group)
    assert got.dtype == dtype and torch.equal(got.cpu(), want), "dequantized weight != (q - z) * s"


# -- GPTQ --------------------------------------------------------------------------------------

# (bits, K, group, N)
GPTQ_SHAPES = [(4, 256, 128, 40), (4, 384, 128, 24), (4, 512, 256, 16), (4, 256, 256, 8), (8, 192, 64, 12),
               (8, 128, 128, 20)]


@pytest.mark.parametrize("shape", GPTQ_SHAPES, ids=lambda s: f"int{s[0]}_k{s[1]}_g{s[2]}_n{s[3]}")
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("device", DEVICES)
def test_gptq_import(shape, dtype, device):
    bits, k, group, n = shape
    codes, zeros, scales = true_weight(n, k, bits, group, dtype)
    qweight, qzeros, s = gptq_pack(codes, zeros, scales, bits)
    g_idx = (torch.arange(k, dtype=torch.int32) // group)
    t = from_gptq(qweight.to(device), qzeros.to(device), s.to(device), g_idx.to(device), bits=bits)
    assert t.packed.device.type == device and t.zeros is not None and t.zeros.dtype == torch.uint8
    assert torch.equal(t.zeros.cpu().to(torch.int64), zeros)
    check_import(t, codes, zeros, scales, bits, group, dtype)
    # the group size given, and no g_idx
    t = from_gptq(qweight.to(device), qzeros.to(device), s.to(device), bits=bits, group_size=group)
    check_import(t, codes, zeros, scales, bits, group, dtype)


@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_symmetric_drops_zeros(bits):
    """Symmetric GPTQ stores z - 1 = 2^(bits-1) - 1; the import needs no zeros for it."""
    n, k, group = 16, 256, 128
    codes, zeros, scales = true_weight(n, k, bits, group, torch.float16, symmetric=True)
    qweight, qzeros, s = gptq_pack(codes, zeros, scales, bits)
    assert ((qzeros.to(torch.int64) & 0xFFFFFFFF) == (0x77777777 if bits == 4 else 0x7F7F7F7F)).all()
    t = from_gptq(qweight, qzeros, s, bits=bits)
    assert t.zeros is None
    check_import(t, codes, zeros, scales, bits, group, torch.float16)


def test_gptq_per_channel():
    """GPTQ's group_size -1: one row of scales and zero points, g_idx all zeros."""
    n, k = 24, 384
    codes, zeros, scales = true_weight(n, k, 4, k, torch.float16)
    qweight, qzeros, s = gptq_pack(codes, zeros, scales, 4)
    assert s.shape == (1, n)
    for group_size in (None, -1, k):
        t = from_gptq(qweight, qzeros, s, torch.zeros(k, dtype=torch.int32), group_size=group_size)
        check_import(t, codes, zeros, scales, 4, k, torch.float16)


def test_gptq_v2_zero_offset():
    """checkpoint_format "gptq_v2" stores z itself (0 included): zero_offset=0."""
    n, k, group = 16, 256, 128
    codes, zeros, scales = true_weight(n, k, 4, group, torch.bfloat16)
    zeros[0, 0] = 0
    qweight, qzeros, s = gptq_pack(codes, zeros, scales, 4, offset=0)
    check_import(from_gptq(qweight, qzeros, s, zero_offset=0), codes, zeros, scales, 4, group, torch.bfloat16)
    zeros[0, 0] = 15  # read as v1, a stored 15 would be z = 16
    qweight, qzeros, s = gptq_pack(codes, zeros, scales, 4, offset=0)
    with pytest.raises(ValueError, match="zero points must lie in"):
        from_gptq(qweight, qzeros, s)


def test_gptq_scales_dtype():
    """dtype converts the checkpoint's float16 scales (a bfloat16 model); float32 scales give bfloat16."""
    n, k, group = 8, 256, 128
    codes, zeros, scales = true_weight(n, k, 4, group, torch.float16)
    qweight, qzeros, s = gptq_pack(codes, zeros, scales, 4)
    check_import(from_gptq(qweight, qzeros, s, dtype=torch.bfloat16), codes, zeros, scales, 4, group, torch.bfloat16)
    check_import(from_gptq(qweight, qzeros, s.float()), codes, zeros, scales.float(), 4, group, torch.bfloat16)
    with pytest.raises(ValueError, match="dtype must be"):
        from_gptq(qweight, qzeros, s, dtype=torch.float32)


@pytest.mark.parametrize("bits,group", [(4, 128), (8, 64)])
@pytest.mark.parametrize("device", DEVICES)
def test_gptq_act_order(bits, group, device):
    """An act-order g_idx: the tensors' dequantized weight and the module's forward are the
    checkpoint's weight in the layer's input order; the state dict keeps the order."""
    n, k, dtype = 24, 384, torch.float16
    codes, zeros, scales = true_weight(n, k, bits, group, dtype)
    g_idx = act_order_g_idx(k, group)
    qweight, qzeros, s = (t.to(device) for t in gptq_pack(codes, zeros, scales, bits))
    want = expected_weight_by_group(codes, zeros, scales, g_idx)
    t = from_gptq(qweight, qzeros, s, g_idx.to(device), bits=bits)
    assert t.input_order is not None and t.input_order.dtype == torch.int64 and t.input_order.device.type == device
    assert torch.equal(g_idx[t.input_order.cpu()], torch.arange(k, dtype=torch.int32) // group), "not sorted by group"
    assert torch.equal(t.dequantize().cpu(), want)
    module = QuantizedLinear.from_gptq(qweight, qzeros, s, g_idx.to(device), bits=bits)
    assert torch.equal(module.dequantize().cpu(), want) and "act_order=True" in repr(module)
    x = torch.randn(5, k, dtype=dtype, device=device)
    exact = (codes - zeros[:, g_idx.long()]).double() * scales.double()[:, g_idx.long()]  # unrounded
    assert_flash_rule(module(x).cpu(), F.linear(x.double(), exact.to(device)).cpu(), F.linear(x, want.to(device)).cpu(),
                      dtype, "act-order forward", ATOL_EPS)
    state = module.state_dict()
    assert set(state) == {"packed", "scales", "zeros", "input_order"}
    fresh = QuantizedLinear(k, n, bits, group, bias=False, zeros=True, device=device, dtype=dtype, act_order=True)
    fresh.load_state_dict(state)
    assert torch.equal(fresh(x), module(x))
    # the trivial order is no order
    assert from_gptq(qweight, qzeros, s, (torch.arange(k, dtype=torch.int32) // group).to(device),
                     bits=bits).input_order is None


def test_fuse_rows_needs_one_input_order():
    """Act-order layers fuse when they share their input order, and only then."""
    from llmk.quantization import fuse_rows
    k, group, dtype = 256, 128, torch.float16
    g_idx = act_order_g_idx(k, group)

    def layer(n, order):
        codes, zeros, scales = true_weight(n, k, 4, group, dtype)
        return QuantizedLinear.from_gptq(*gptq_pack(codes, zeros, scales, 4), order), \
            expected_weight_by_group(codes, zeros, scales, order)

    (a, wa), (b, wb) = layer(16, g_idx), layer(8, g_idx)
    fused = fuse_rows([a, b])
    assert fused is not None and torch.equal(fused.input_order, a.input_order)
    assert torch.equal(fused.dequantize(), torch.cat([wa, wb]))
    x = torch.randn(3, k, dtype=dtype)
    assert torch.equal(fused(x), torch.cat([a(x), b(x)], -1))
    other, _ = layer(8, act_order_g_idx(k, group))
    plain = QuantizedLinear.from_gptq(*gptq_pack(*true_weight(8, k, 4, group, dtype), 4))
    assert fuse_rows([a, other]) is None and fuse_rows([a, plain]) is None and fuse_rows([plain, a]) is None


def test_gptq_act_order_rejects():
    n, k, group = 8, 256, 128
    codes, zeros, scales = true_weight(n, k, 4, group, torch.float16)
    qweight, qzeros, s = gptq_pack(codes, zeros, scales, 4)
    g_idx = act_order_g_idx(k, group)
    with pytest.raises(ValueError, match=r"g_idx must be an integer tensor \[K\] = \[256\]"):
        from_gptq(qweight, qzeros, s, g_idx[: k - 1])
    with pytest.raises(ValueError, match="g_idx must be an integer tensor"):
        from_gptq(qweight, qzeros, s, g_idx.float())
    uneven = g_idx.clone()
    uneven[(uneven == 0).nonzero()[0]] = 1  # group 0 one input short, group 1 one over
    with pytest.raises(ValueError, match="does not give each of the 2 groups 128 inputs"):
        from_gptq(qweight, qzeros, s, uneven)
    outside = g_idx.clone()
    outside[0] = 2
    with pytest.raises(ValueError, match=r"group ids 0..2"):
        from_gptq(qweight, qzeros, s, outside)


def test_gptq_bad_inputs():
    n, k, group = 16, 256, 128
    codes, zeros, scales = true_weight(n, k, 4, group, torch.float16)
    qweight, qzeros, s = gptq_pack(codes, zeros, scales, 4)
    with pytest.raises(ValueError, match="bits"):
        from_gptq(qweight, qzeros, s, bits=3)
    with pytest.raises(ValueError, match="qweight must be a 2-d int32"):
        from_gptq(qweight.to(torch.int64), qzeros, s)
    with pytest.raises(ValueError, match="qzeros must be a 2-d int32"):
        from_gptq(qweight, qzeros[0], s)
    with pytest.raises(ValueError, match="scales must be"):
        from_gptq(qweight, qzeros, s[:, :8])
    with pytest.raises(ValueError, match="qzeros must be"):
        from_gptq(qweight, qzeros[:1], s)
    with pytest.raises(ValueError, match="group_size 64"):
        from_gptq(qweight, qzeros, s, group_size=64)
    with pytest.raises(ValueError, match="does not divide"):
        from_gptq(qweight, qzeros[:, :0].new_zeros(3, 2), s.new_zeros(3, n))
    # GPTQ's group 64 is a valid checkpoint but not llmk's int4 format
    codes, zeros, scales = true_weight(n, k, 4, 64, torch.float16)
    qweight, qzeros, s = gptq_pack(codes, zeros, scales, 4)
    with pytest.raises(ValueError, match="multiple of 128"):
        from_gptq(qweight, qzeros, s)
    # K = 64 * 3 is fine for int8 (group 64) but not for int4
    codes, zeros, scales = true_weight(n, 192, 4, 64, torch.float16)
    qweight, qzeros, s = gptq_pack(codes, zeros, scales, 4)
    with pytest.raises(ValueError, match="in_features a multiple of 128"):
        from_gptq(qweight, qzeros, s)


# -- AWQ ---------------------------------------------------------------------------------------

# (K, group, N)
AWQ_SHAPES = [(256, 128, 40), (384, 128, 16), (512, 256, 8), (256, 256, 24)]


@pytest.mark.parametrize("shape", AWQ_SHAPES, ids=lambda s: f"k{s[0]}_g{s[1]}_n{s[2]}")
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("device", DEVICES)
def test_awq_import(shape, dtype, device):
    k, group, n = shape
    codes, zeros, scales = true_weight(n, k, 4, group, dtype)
    zeros[0, 0] = 0  # AWQ stores z itself
    qweight, qzeros, s = awq_pack(codes, zeros, scales)
    assert qweight.shape == (k, n // 8) and qzeros.shape == (k // group, n // 8)
    t = from_awq(qweight.to(device), qzeros.to(device), s.to(device))
    assert t.packed.device.type == device and torch.equal(t.zeros.cpu().to(torch.int64), zeros)
    check_import(t, codes, zeros, scales, 4, group, dtype)
    check_import(from_awq(qweight, qzeros, s, group_size=group), codes, zeros, scales, 4, group, dtype)


def test_awq_symmetric_drops_zeros():
    codes, zeros, scales = true_weight(16, 256, 4, 128, torch.float16, symmetric=True)
    t = from_awq(*awq_pack(codes, zeros, scales))
    assert t.zeros is None
    check_import(t, codes, zeros, scales, 4, 128, torch.float16)


def test_awq_bad_inputs():
    n, k, group = 16, 256, 128
    codes, zeros, scales = true_weight(n, k, 4, group, torch.float16)
    qweight, qzeros, s = awq_pack(codes, zeros, scales)
    with pytest.raises(ValueError, match="4-bit"):
        from_awq(qweight, qzeros, s, bits=8)
    with pytest.raises(ValueError, match="qweight must be a 2-d int32"):
        from_awq(qweight.float(), qzeros, s)
    with pytest.raises(ValueError, match="scales must be"):
        from_awq(qweight, qzeros, s.t())
    with pytest.raises(ValueError, match="qzeros must be"):
        from_awq(qweight, qzeros[:, :1], s)
    with pytest.raises(ValueError, match="qzeros must be"):
        from_awq(qweight, qzeros, s[:1])  # one row of scales: groups of 256, which qzeros does not have
    with pytest.raises(ValueError, match="group_size 64"):
        from_awq(qweight, qzeros, s, group_size=64)


# -- QuantizedLinear ---------------------------------------------------------------------------


def exact_weight(module: QuantizedLinear) -> torch.Tensor:
    """(q - z) * s in float64, unrounded (test_quantized_linear.exact_weight says why)."""
    q_minus_z = llmk.dequantize_weight(module.packed, torch.ones_like(module.scales), module.zeros, module.bits,
                                       module.group_size)
    return q_minus_z.double() * module.scales.double().repeat_interleave(module.group_size, dim=1)


def check_forward(module: QuantizedLinear, x: torch.Tensor, what: str):
    """module(x) against x · Wᵀ + b in float64 on the exact quantized weight, with torch's
    F.linear on the dequantized weight in x's dtype as the yardstick."""
    w = module.dequantize()
    b = module.bias
    got = module(x)
    assert got.shape == (*x.shape[:-1], module.out_features) and got.dtype == x.dtype
    want = F.linear(x.double(), exact_weight(module), None if b is None else b.double())
    theirs = F.linear(x, w, b)
    assert_flash_rule(got.cpu(), want.cpu(), theirs.cpu(), x.dtype, what, ATOL_EPS)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("device", DEVICES)
def test_module_from_gptq_and_awq(dtype, device):
    n, k, group = 48, 256, 128
    codes, zeros, scales = true_weight(n, k, 4, group, dtype)
    bias = torch.randn(n, dtype=dtype)
    x = torch.randn(5, 3, k, dtype=dtype, device=device)
    gptq = QuantizedLinear.from_gptq(*[t.to(device) for t in gptq_pack(codes, zeros, scales, 4)], bias=bias.to(device))
    awq = QuantizedLinear.from_awq(*[t.to(device) for t in awq_pack(codes, zeros, scales)])
    want_w = expected_weight(codes, zeros, scales, group)
    for module, has_bias in ((gptq, True), (awq, False)):
        assert (module.in_features, module.out_features, module.bits, module.group_size) == (k, n, 4, group)
        assert (module.bias is not None) == has_bias and module.zeros is not None
        assert torch.equal(module.dequantize().cpu(), want_w)
        check_forward(module, x, f"{'gptq' if has_bias else 'awq'} forward")
    assert torch.equal(gptq.bias.cpu(), bias)


# (bits, group_size or None, symmetric)
MODULE_FORMATS = [(4, 128, True), (4, 128, False), (4, None, True), (8, None, True), (8, 64, False)]


@pytest.mark.parametrize("fmt", MODULE_FORMATS, ids=lambda f: f"int{f[0]}_g{f[1]}_{'sym' if f[2] else 'zeros'}")
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("device", DEVICES)
def test_module_from_linear(fmt, dtype, device):
    bits, group, symmetric = fmt
    linear = nn.Linear(256, 72, device=device, dtype=dtype)
    q = QuantizedLinear.from_linear(linear, bits, group, symmetric)
    assert q.bias is linear.bias and q.scales.dtype == dtype and q.packed.device == linear.weight.device
    assert q.group_size == (group or 256) and (q.zeros is None) == symmetric
    packed, scales, zeros = llmk.quantize_weight(linear.weight.detach(), bits, group, symmetric)
    assert torch.equal(q.packed, packed) and torch.equal(q.scales, scales)
    assert torch.equal(q.dequantize(), llmk.dequantize_weight(packed, scales, zeros, bits, group or 256))
    # a round-to-nearest weight: within half a step (plus the scale's rounding) of the original
    err = (q.dequantize().double() - linear.weight.double()).abs().max().item()
    assert err <= 1.01 * q.scales.double().abs().max().item()
    check_forward(q, torch.randn(7, 256, dtype=dtype, device=device), "from_linear forward")
    r = repr(q)
    assert f"in_features=256, out_features=72, bits={bits}, group_size={group or 256}" in r
    assert f"zeros={not symmetric}, bias=True" in r


def test_module_from_linear_refuses():
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        QuantizedLinear.from_linear(nn.Linear(256, 8))
    with pytest.raises(ValueError, match="multiple of 128"):
        QuantizedLinear.from_linear(nn.Linear(192, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="group_size"):
        QuantizedLinear.from_linear(nn.Linear(256, 8, dtype=torch.float16), group_size=64)
    with pytest.raises(ValueError, match="bits"):
        QuantizedLinear(256, 8, bits=2)


@pytest.mark.parametrize("fmt", MODULE_FORMATS, ids=lambda f: f"int{f[0]}_g{f[1]}_{'sym' if f[2] else 'zeros'}")
@pytest.mark.parametrize("device", DEVICES)
def test_module_state_dict(fmt, device):
    bits, group, symmetric = fmt
    dtype = torch.bfloat16
    q = QuantizedLinear.from_linear(nn.Linear(384 if bits == 4 else 192, 40, dtype=dtype, device=device), bits,
                                    group, symmetric)
    state = q.state_dict()
    assert set(state) == {"packed", "scales", "bias"} | (set() if symmetric else {"zeros"})
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    fresh = QuantizedLinear(q.in_features, q.out_features, bits, group, bias=True, zeros=not symmetric,
                            device=device, dtype=dtype)
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    for name in state:
        assert torch.equal(getattr(fresh, name), getattr(q, name)), name
    x = torch.randn(4, q.in_features, dtype=dtype, device=device)
    assert torch.equal(fresh(x), q(x))
    # a module without zero points does not take a state dict with them, and vice versa
    other = QuantizedLinear(q.in_features, q.out_features, bits, group, zeros=symmetric, device=device, dtype=dtype)
    with pytest.raises(RuntimeError):
        other.load_state_dict(state)


def test_module_half_and_bias_grad():
    """model.half() converts scales and bias; the bias trains (quantized_linear's autograd)."""
    q = QuantizedLinear.from_linear(nn.Linear(256, 16, dtype=torch.bfloat16))
    q.half()
    assert q.scales.dtype == torch.float16 and q.bias.dtype == torch.float16 and q.packed.dtype == torch.int32
    x = torch.randn(3, 256, dtype=torch.float16, requires_grad=True)
    q(x).sum().backward()
    assert x.grad is not None and torch.equal(q.bias.grad, torch.full_like(q.bias, 3))


# -- quantize_model ----------------------------------------------------------------------------


def tiny_model(dtype, device):
    """proj_in (K = 96: fits no format) -> up (K = 256) -> GELU -> down (K = 384) -> lm_head."""
    torch.manual_seed(1234)
    return nn.Sequential(OrderedDict(
        proj_in=nn.Linear(96, 256), up=nn.Linear(256, 384), act=nn.GELU(), down=nn.Linear(384, 256, bias=False),
        lm_head=nn.Linear(256, 64))).to(device, dtype)


SCHEMES = {  # scheme -> (bits, group or None, what quantizes, what the layout skips)
    "int4-g128": (4, 128, ["up", "down"], {"proj_in": "multiple of 128"}),
    "int4": (4, None, ["up", "down"], {"proj_in": "multiple of 128"}),
    "int8": (8, None, ["up", "down"], {"proj_in": "multiple of 64"}),
    "int4-g256": (4, 256, ["up"], {"proj_in": "multiple of 128", "down": "group_size"}),
    "int8-g64": (8, 64, ["up", "down"], {"proj_in": "multiple of 64"}),
}


def packed_bytes(n, k, bits, group, dtype_size=2):
    return n * k * bits // 8 + n * (k // group) * dtype_size


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("device", DEVICES)
def test_quantize_model(scheme, dtype, device):
    bits, group, names, layout_skips = SCHEMES[scheme]
    model = tiny_model(dtype, device)
    original = copy.deepcopy(model)
    linears = {name: getattr(model, name) for name in names}
    report = quantize_model(model, scheme)
    assert report["quantized"] == names
    assert set(report["skipped"]) == {"lm_head", *layout_skips}
    assert "by name" in report["skipped"]["lm_head"]
    for name, fragment in layout_skips.items():
        assert fragment in report["skipped"][name], report["skipped"][name]
        assert type(getattr(model, name)) is nn.Linear
    for name in names:
        q = getattr(model, name)
        assert isinstance(q, QuantizedLinear) and q.bits == bits and q.group_size == (group or q.in_features)
        assert q.bias is linears[name].bias  # the same Parameter (None for down)
    before = sum(p.numel() * p.element_size() for p in original.parameters())
    saved = sum(getattr(original, name).weight.numel() * 2 for name in names)
    added = sum(packed_bytes(getattr(model, name).out_features, getattr(model, name).in_features, bits,
                             group or getattr(model, name).in_features) for name in names)
    assert report["bytes_before"] == before and report["bytes_after"] == before - saved + added

    # the quantized model computes the original model with the quantized weights (float64 on the
    # exact ones; torch on the dequantized ones the yardstick)
    dequantized = copy.deepcopy(original)
    exact = copy.deepcopy(original).double()
    for name in names:
        getattr(dequantized, name).weight.data = getattr(model, name).dequantize()
        getattr(exact, name).weight.data = exact_weight(getattr(model, name))
    x = torch.randn(2, 5, 96, dtype=dtype, device=device)
    with torch.no_grad():
        got = model(x)
        theirs = dequantized(x)
        want = exact(x.double())
    assert_flash_rule(got.cpu(), want.cpu(), theirs.cpu(), dtype, f"{scheme} model output", ATOL_EPS)


def test_quantize_model_asymmetric_and_skip_names():
    model = nn.Sequential(OrderedDict(
        block=nn.Sequential(OrderedDict(mlp=nn.Sequential(OrderedDict(up=nn.Linear(128, 128))),
                                        attn=nn.Linear(128, 128))),
        lm_head=nn.Linear(128, 128))).to(torch.bfloat16)
    report = quantize_model(model, "int4", skip=["mlp"], symmetric=False)
    assert report["quantized"] == ["block.attn", "lm_head"]
    assert list(report["skipped"]) == ["block.mlp.up"]
    assert model.lm_head.zeros is not None
    model = nn.Sequential(OrderedDict(head=nn.Linear(128, 128), lm_head=nn.Linear(128, 128))).to(torch.float16)
    report = quantize_model(model, "int4", skip="head")  # whole components only: lm_head is not "head"
    assert report["quantized"] == ["lm_head"] and list(report["skipped"]) == ["head"]


def test_quantize_model_skip_rules():
    class Sub(nn.Linear):
        pass

    bf16 = dict(dtype=torch.bfloat16)
    hooked, replaced, patched = (nn.Linear(128, 128, **bf16) for _ in range(3))
    hooked.register_forward_hook(lambda module, args, out: out)
    replaced.forward = lambda x: x  # what transformers' tensor parallelism and accelerate's hooks do

    def llmk_forward(self, x):
        return F.linear(x, self.weight, self.bias)

    llmk_forward._llmk = True  # what llmk.patch marks its forwards with
    patched.forward = llmk_forward.__get__(patched)
    model = nn.ModuleDict(dict(
        sub=Sub(128, 128, **bf16), hooked=hooked, replaced=replaced, patched=patched,
        float32=nn.Linear(128, 128, dtype=torch.float32), mha=nn.MultiheadAttention(128, 2, **bf16)))
    meta = nn.Sequential(nn.Linear(128, 128, device="meta", dtype=torch.float16))
    report = quantize_model(model, "int4-g128")
    assert report["quantized"] == ["patched"]
    reasons = report["skipped"]
    assert set(reasons) == {"sub", "hooked", "replaced", "float32", "mha.out_proj"}
    assert "subclass" in reasons["sub"] and "subclass" in reasons["mha.out_proj"]
    assert "hooks" in reasons["hooked"] and "forward is replaced" in reasons["replaced"]
    assert "torch.float32" in reasons["float32"]
    assert "meta" in quantize_model(meta)["skipped"]["0"]
    top = nn.Linear(128, 128, dtype=torch.float16)
    assert "model itself" in quantize_model(top)["skipped"][""]


def test_quantize_model_shared_module():
    """A module under two names is replaced by one QuantizedLinear under both."""
    shared = nn.Linear(128, 128, dtype=torch.float16)
    model = nn.ModuleDict(dict(a=shared, b=nn.Sequential(shared)))
    report = quantize_model(model, "int8")
    assert report["quantized"] == ["a", "b.0"] and model.a is model.b[0]
    assert isinstance(model.a, QuantizedLinear)


def test_quantize_model_dtensor(tmp_path):
    """A tensor-parallel (DTensor) weight is left with its reason (a one-process gloo group)."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    initialized_here = not dist.is_initialized()
    if initialized_here:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        model = nn.Sequential(nn.Linear(128, 128, dtype=torch.bfloat16), nn.Linear(128, 128, dtype=torch.bfloat16))
        model[0].weight = nn.Parameter(distribute_tensor(model[0].weight.detach(), mesh, [Shard(0)]))
        report = quantize_model(model, "int4-g128")
        assert report["quantized"] == ["1"] and "DTensor" in report["skipped"]["0"]
    finally:
        if initialized_here:
            dist.destroy_process_group()


def test_parse_scheme():
    assert parse_scheme("int4-g128") == (4, 128)
    assert parse_scheme("int4") == (4, None)
    assert parse_scheme("INT8") == (8, None)
    assert parse_scheme("int4-g512") == (4, 512)
    assert parse_scheme("int8-g64") == (8, 64)
    for bad in ("int3", "int4-g64", "int4-gx", "fp8", "int8-g32"):
        with pytest.raises(ValueError):
            parse_scheme(bad)
    with pytest.raises(ValueError, match="unknown scheme"):
        quantize_model(nn.Linear(128, 8), "nf4")



# -- whole checkpoints ---------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["gptq", "gptq_v2", "gptq_act_order", "awq"])
def test_load_quantized_state_dict(method):
    """A tiny Llama's GPTQ / AWQ checkpoint (its projections' codes packed by this file's own
    packers, everything else as saved) loads into a freshly initialized model, whose logits then
    follow the original model given the dequantized weights. Act order: one g_idx per input
    (q/k/v share theirs, gate/up theirs, as a quantizer's shared inputs give them)."""
    transformers = pytest.importorskip("transformers")
    from llmk.quantization import load_quantized_state_dict
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=200,
                                      tie_word_embeddings=True)
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    checkpoint = dict(reference.state_dict())
    checkpoint.pop("lm_head.weight")  # tied: saved once, as the embedding
    orders = {}  # (parent module, K) -> an act-order g_idx
    for name, module in reference.named_modules():
        if not isinstance(module, nn.Linear) or name == "lm_head":
            continue
        n, k = module.weight.shape
        codes, zeros, scales = true_weight(n, k, 4, 128, torch.float16)
        del checkpoint[f"{name}.weight"]
        if method == "awq":
            qweight, qzeros, s = awq_pack(codes, zeros, scales)
        else:
            qweight, qzeros, s = gptq_pack(codes, zeros, scales, 4, offset=0 if method == "gptq_v2" else 1)
            g_idx = torch.arange(k, dtype=torch.int32) // 128
            if method == "gptq_act_order":
                g_idx = orders.setdefault((name.rpartition(".")[0], k), act_order_g_idx(k, 128))
            checkpoint[f"{name}.g_idx"] = g_idx
        with torch.no_grad():  # the weight the loaded layer must compute with (bf16 scales)
            module.weight.copy_(expected_weight_by_group(codes, zeros, scales.to(torch.bfloat16), g_idx)
                                if method == "gptq_act_order" else
                                expected_weight(codes, zeros, scales.to(torch.bfloat16), 128))
        checkpoint.update({f"{name}.qweight": qweight, f"{name}.qzeros": qzeros, f"{name}.scales": s})
    config_q = {"quant_method": "awq", "w_bit": 4, "q_group_size": 128, "version": "gemm"} if method == "awq" else \
        {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": method == "gptq_act_order",
         "checkpoint_format": "gptq" if method == "gptq_act_order" else method}
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    report = load_quantized_state_dict(model, checkpoint, config_q)
    assert len(report["quantized"]) == 14 and "model.embed_tokens.weight" in report["loaded"]
    assert all(isinstance(model.get_submodule(n), QuantizedLinear) for n in report["quantized"])
    assert all((model.get_submodule(n).input_order is not None) == (method == "gptq_act_order")
               for n in report["quantized"])
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.randint(0, 200, (1, 12))
    with torch.no_grad():
        got, want = model(ids).logits.float(), reference(ids).logits.float()
    assert ((got - want).abs().max() / want.abs().max()).item() <= 4e-2
    # llmk.patch fuses the checkpoint's q/k/v and gate/up layers; unpatch leaves them quantized
    report = llmk.patch(model)
    assert report.replaced[llmk.patching.FUSED_REPORT] == 4
    with torch.no_grad():
        patched = model(ids).logits.float()
    assert ((patched - want).abs().max() / want.abs().max()).item() <= 4e-2
    llmk.unpatch(model)
    assert isinstance(model.model.layers[0].self_attn.q_proj, QuantizedLinear)
    assert "_llmk_gate_up" not in model.model.layers[0].mlp.__dict__


def test_load_quantized_state_dict_rejects():
    transformers = pytest.importorskip("transformers")
    from llmk.quantization import load_quantized_state_dict
    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=200)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    state = dict(model.state_dict())
    with pytest.raises(ValueError, match="quant_method 'bitsandbytes' is not read"):
        load_quantized_state_dict(model, state, {"quant_method": "bitsandbytes"})
    with pytest.raises(ValueError, match="AWQ version 'gemv' is not read"):
        load_quantized_state_dict(model, state, {"quant_method": "awq", "version": "gemv"})
    state.pop("model.norm.weight")
    with pytest.raises(ValueError, match=r"does not match the model: missing \['model.norm.weight'\]"):
        load_quantized_state_dict(model, state, {"quant_method": "gptq", "bits": 4, "group_size": 128})
    state = {"model.layers.0.mlp.act_fn.qweight": torch.zeros(16, 8, dtype=torch.int32)}
    with pytest.raises(ValueError, match="not an nn.Linear"):
        load_quantized_state_dict(model, state, {"quant_method": "gptq", "bits": 4, "group_size": 128})
