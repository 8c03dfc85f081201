"""llmk.fused_linear_cross_entropy: the loss and the gradients of hidden, weight and bias against
the unfused float64 composition (F.linear in float64, then F.cross_entropy plus the z-loss) on CPU
and CUDA, every reduction, ignored rows, an all-ignored batch, label smoothing, z-loss, chunk sizes
that do and do not divide the tokens (1, 3, tokens - 1, tokens, the default), a single token, a
vocabulary that is a multiple of 8 (llmk's GEMM kernels for the logits) and one that is not
(torch's), fp16 and bf16, batched hidden, the weight's gradient summed in its own dtype (the
default) and in float32 (weight_grad_dtype); the gradient written over the chunk's logits against
the gradient in a buffer of its own (the path float16 "mean" and "none" take); the chunking
against llmk's own unfused composition; the sum in the weight's dtype bit for bit; the in-place
backward of that mode; the no-gradient path; the default chunk size; bad arguments. Shapes are
small (H 32, V 96/101, 13 tokens) so the CPU run takes a few seconds; the CUDA cases add the GEMM
kernels' sizes, cuBLAS's in-place sums against the GEMM-with-residual they replaced, and the
memory a call needs beyond its gradients.

Tolerances. llmk rounds three times where the float64 composition does not, each rounding to the
dtype with unit roundoff u (2^-8 bf16, 2^-11 fp16): the logits z (|dz| <= u Z, Z the row's
max|z|), the logits' gradient g (u |g|; for "mean" / "sum" the gradient of the summed losses,
whose rounding is the same relative one), and the products (u |result|, and once more when the
backward scales a saved gradient by its float32 factor; the weight's gradient summed in its
dtype rounds the running sum S_c after each chunk c, summed in float32 adds the products
unrounded and rounds once at the end). Propagated to first order (error_bounds below):

- a row's loss moves by at most u Z (2 + 2 z_loss |lse| + z_loss u Z) (lse and the target logit
  each by u Z); mean / sum / none reduce those bounds like the losses;
- g_j = s (p_j (1 + 2 z_loss lse) - (1 - eps) [j = t] - eps / V) (s the row's upstream scale)
  moves by s u Z p_j (2 |1 + 2 z_loss lse| + 2 z_loss) through z, plus its own rounding u |g_j|:
  E, elementwise;
- dhidden = g · W moves by E · |W| + 2 u |dhidden|; dweight = Σ_chunks g_cᵀ h_c by Eᵀ · |h| +
  2 u |dweight|, plus u Σ_{c<n} |S_c| summed in its dtype (the last sum's rounding being the
  final one); dbias by the column sums of E + 2 u |dbias|.

The test allows twice these elementwise bounds (second-order terms, the kernels' float32
arithmetic) plus 1e-6 of the largest reference value; over 40 seeds the worst error was 0.4 of
that allowance (with the sum in the weight's dtype, 0.4 over 20 seeds). A lost row moves an
element by about s |h| (or s |W|), far beyond it: dropping one row per chunk from dweight, or
scaling a gradient by 1.01-1.02, failed 54 to 72 of 108 of these cases in a hand run (every one
where the mutation applies, for the dropped row); with the sum in the weight's dtype, dropping
one row per chunk failed 48 of 120 cases (every one where the mutation applies: chunks of more
than one row that are not the whole batch) and ignoring the running sum 72."""

import pytest
import torch
import torch.nn.functional as F

import llmk
from conftest import DEVICES, requires_cuda
from llmk.ops.loss import _flce_chunk_size

HALF = [torch.float16, torch.bfloat16]
H, TOKENS = 32, 13
CHUNKS = [None, 1, 3, TOKENS - 1, TOKENS]
# (bias, label_smoothing, z_loss)
OPTIONS = {"plain": (False, 0.0, 0.0), "bias_smoothing_zloss": (True, 0.1, 0.01)}


def make(device, dtype, shape, vocab, bias=False, ignored=(2, 7), size=H):
    hidden = torch.randn(*shape, size, device=device).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, size, device=device) * 0.5).to(dtype).requires_grad_()
    b = (torch.randn(vocab, device=device) * 0.5).to(dtype).requires_grad_() if bias else None
    target = torch.randint(0, vocab, shape, device=device)
    flat = target.view(-1)
    for i in ignored:
        if i < flat.numel():
            flat[i] = -100
    return hidden, weight, b, target


def reference(hidden, weight, bias, target, label_smoothing, z_loss, reduction):
    """The unfused composition in float64, with its leaves (for the gradients)."""
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (hidden, weight, bias)]
    h, w, b = leaves
    z = F.linear(h, w, b).reshape(-1, w.shape[0])
    t = target.reshape(-1)
    rows = F.cross_entropy(z, t, ignore_index=-100, label_smoothing=label_smoothing, reduction="none")
    rows = rows + torch.where(t == -100, 0.0, z_loss * torch.logsumexp(z, -1) ** 2)
    if reduction == "none":
        return rows.view(target.shape), leaves
    if reduction == "sum":
        return rows.sum(), leaves
    return rows.sum() / (t != -100).sum(), leaves


def error_bounds(hidden, weight, bias, target, label_smoothing, z_loss, reduction, dloss, chunk, sum_rounded=True):
    """Elementwise bounds on |llmk - float64| (the module docstring's derivation): the loss, then
    dhidden, dweight, dbias. `sum_rounded`: the weight's gradient is summed in its dtype (the
    running sum rounded after each chunk but the last, whose rounding is the final one), else in
    float32 (whose roundings, 2^-24 relative, the 1e-6 floor of assert_within covers)."""
    finfo = torch.finfo(hidden.dtype)
    u, tiny = finfo.eps / 2, finfo.smallest_normal * finfo.eps / 2  # relative, and subnormal, rounding
    vocab = weight.shape[0]
    h = hidden.detach().double().reshape(-1, hidden.shape[-1]).cpu()
    w = weight.detach().double().cpu()
    t = target.reshape(-1).cpu()
    z = h @ w.t() + (bias.detach().double().cpu() if bias is not None else 0.0)
    valid = t != -100
    n = valid.sum()
    lse, p = torch.logsumexp(z, -1), torch.softmax(z, -1)
    zmax = z.abs().amax(-1)
    dloss = dloss.detach().double().cpu()
    s = dloss.reshape(-1) if reduction == "none" else (dloss / n if reduction == "mean" else dloss).expand(len(t))
    s = torch.where(valid, s, 0.0)
    c = 1 + 2 * z_loss * lse
    onehot = F.one_hot(t.clamp(min=0), vocab).double()
    g = s[:, None] * (p * c[:, None] - (1 - label_smoothing) * onehot - label_smoothing / vocab)
    e = s.abs()[:, None] * u * zmax[:, None] * p * (2 * c.abs() + 2 * z_loss)[:, None] + u * g.abs() + tiny
    loss_rows = torch.where(valid, u * zmax * (2 + 2 * z_loss * lse.abs() + z_loss * u * zmax), 0.0)
    if reduction == "none":
        loss = loss_rows.view(target.shape)
    else:
        loss = loss_rows.sum() / (n if reduction == "mean" else 1)
    dh = e @ w.abs() + 2 * (u * (g @ w).abs() + tiny)
    products = [g[i:i + chunk].t() @ h[i:i + chunk] for i in range(0, len(t), chunk)]
    per_chunk = 0
    if len(products) > 1 and sum_rounded:  # the running sums S_1 .. S_{n-1}, each rounded once
        per_chunk = (u * torch.stack(products[:-1]).cumsum(0).abs() + tiny).sum(0)
    dw = e.t() @ h.abs() + per_chunk + 2 * (u * (g.t() @ h).abs() + tiny)
    db = e.sum(0) + 2 * (u * g.sum(0).abs() + tiny)
    return loss, dh.view(hidden.shape), dw, db


def assert_within(got, want, bound, what):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = (got - want).abs()
    allowed = 2 * bound + 1e-6 * want.abs().max().item()
    bad = ~(err <= allowed)
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.numel()} elements out of the rounding bound; "
                           f"worst err / allowed {(err / allowed).nan_to_num(float('inf')).max().item():.3g}")


def check(device, dtype, shape, vocab, reduction, chunk, bias, label_smoothing, z_loss, ignored=(2, 7), size=H,
          weight_grad_dtype=None):
    hidden, weight, b, target = make(device, dtype, shape, vocab, bias, ignored, size)
    loss = llmk.fused_linear_cross_entropy(hidden, weight, target, b, label_smoothing=label_smoothing,
                                           reduction=reduction, z_loss=z_loss, chunk_size=chunk,
                                           weight_grad_dtype=weight_grad_dtype)
    want, leaves = reference(hidden, weight, b, target, label_smoothing, z_loss, reduction)
    assert loss.dtype == torch.float32
    dloss = torch.randn(want.shape, device=device)
    loss.backward(dloss)
    want.backward(dloss.double())
    tokens = target.numel()
    sum_rounded = weight_grad_dtype != torch.float32
    effective = chunk or _flce_chunk_size(tokens, size, vocab, True, 2 if sum_rounded else 4)
    bounds = error_bounds(hidden, weight, b, target, label_smoothing, z_loss, reduction, dloss, effective,
                          sum_rounded)
    assert_within(loss, want, bounds[0], "loss")
    for name, got, ref, bound in zip(("dhidden", "dweight", "dbias"), (hidden, weight, b), leaves, bounds[1:]):
        if got is not None:
            assert got.grad is not None and got.grad.dtype == dtype, name
            assert_within(got.grad, ref.grad, bound, name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("vocab", [96, 101])
@pytest.mark.parametrize("options", list(OPTIONS))
@pytest.mark.parametrize("weight_grad_dtype", [None, torch.float32])
def test_matches_float64(device, dtype, reduction, chunk, vocab, options, weight_grad_dtype):
    check(device, dtype, (TOKENS,), vocab, reduction, chunk, *OPTIONS[options], weight_grad_dtype=weight_grad_dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk", [None, 1, 4])
def test_batched_hidden(device, reduction, chunk):
    check(device, torch.bfloat16, (2, 5), 96, reduction, chunk, True, 0.1, 0.01)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk", [None, 1])
def test_single_token(device, reduction, chunk):
    check(device, torch.bfloat16, (1,), 101, reduction, chunk, True, 0.0, 0.0, ignored=())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunk", [None, 1, 3])
def test_all_ignored(device, chunk):
    """Every row ignored: "mean" is 0 / 0 = NaN, as PyTorch's F.cross_entropy and llmk.cross_entropy
    (whose gradients are then zero, as these are); "sum" 0; "none" zeros."""
    for reduction in ("mean", "sum", "none"):
        hidden, weight, b, target = make(device, torch.bfloat16, (5,), 96, True, ignored=range(5))
        loss = llmk.fused_linear_cross_entropy(hidden, weight, target, b, reduction=reduction, chunk_size=chunk)
        want, _ = reference(hidden, weight, b, target, 0.0, 0.0, reduction)
        want = want.cpu()
        assert torch.equal(loss.isnan().cpu(), want.isnan()) and torch.equal(loss.nan_to_num().double().cpu(),
                                                                             want.nan_to_num()), reduction
        loss.sum().backward()
        for t in (hidden, weight, b):
            assert torch.count_nonzero(t.grad) == 0, reduction


@pytest.mark.parametrize("chunk", [1, 3, 12, 13])
@pytest.mark.parametrize("weight_grad_dtype", [None, torch.float32])
def test_chunks_match_unfused_llmk(chunk, weight_grad_dtype):
    """CPU, "sum" (upstream 1: the backward's factor is exact): the chunks change nothing but the
    weight's gradient's rounding. llmk's reference GEMM and cross-entropy compute each row alone,
    so the loss and dhidden equal those of llmk.linear then llmk.cross_entropy(grad_in_logits=True)
    (the same gradient kernel) over all tokens at once; dweight is within its rounding bound: one
    rounding of the running sum per chunk (the weight's dtype) or only the final one (float32)."""
    hidden, weight, b, target = make("cpu", torch.bfloat16, (TOKENS,), 96, True)
    args = dict(label_smoothing=0.1, z_loss=0.01, reduction="sum")
    loss = llmk.fused_linear_cross_entropy(hidden, weight, target, b, chunk_size=chunk,
                                           weight_grad_dtype=weight_grad_dtype, **args)
    loss.backward()
    got = [t.grad for t in (hidden, weight, b)]
    for t in (hidden, weight, b):
        t.grad = None
    want = llmk.cross_entropy(llmk.linear(hidden, weight, b), target, grad_in_logits=True, **args)
    want.backward()
    assert torch.equal(loss, want)
    assert torch.equal(got[0], hidden.grad)
    u = 2.0**-8
    dz = torch.autograd.functional.vjp(lambda z: llmk.cross_entropy(z, target, **args),
                                       llmk.linear(hidden, weight, b).detach())[1].double()
    h = hidden.detach().double()
    sums = [dz[:i + chunk].t() @ h[:i + chunk] for i in range(0, TOKENS - chunk, chunk)]  # S_1 .. S_{n-1}
    per_chunk = u * sum(s.abs() for s in sums) if weight_grad_dtype is None else 0
    assert ((got[1].double() - weight.grad.double()).abs() <= per_chunk + 2 * u * weight.grad.double().abs()).all()
    torch.testing.assert_close(got[2], b.grad, rtol=2**-7, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "reduction"), [(torch.bfloat16, "mean"), (torch.bfloat16, "sum"),
                                                  (torch.float16, "sum")])
@pytest.mark.parametrize("chunk", [None, 3])
@pytest.mark.parametrize("weight_grad_dtype", [None, torch.float32])
def test_gradient_over_logits_matches_its_own_buffer(device, dtype, reduction, chunk, weight_grad_dtype, monkeypatch):
    """The forward of "mean" / "sum" writes each chunk's gradient (of the summed losses) over the
    chunk's logits and applies 1 / count with the upstream gradient; the path it replaced (kept
    for float16 "mean") writes the gradient with 1 / count into a buffer of its own
    (cross_entropy_backward). Same loss bit for bit (the same loss kernel); gradients within the
    rounding bound of each other (each is within it of float64: test_matches_float64)."""
    hidden, weight, b, target = make(device, dtype, (TOKENS,), 96, True)
    args = dict(label_smoothing=0.1, z_loss=0.01, reduction=reduction, chunk_size=chunk,
                weight_grad_dtype=weight_grad_dtype)
    dloss = torch.tensor(0.7, device=device)
    results = []
    for over_logits in (True, False):
        monkeypatch.setattr(llmk.ops.loss, "_grad_in_logits", lambda *unused, v=over_logits: v)
        loss = llmk.fused_linear_cross_entropy(hidden, weight, target, b, **args)
        loss.backward(dloss)
        results.append([loss.detach()] + [t.grad for t in (hidden, weight, b)])
        for t in (hidden, weight, b):
            t.grad = None
    (loss, *grads), (loss_own, *grads_own) = results
    assert torch.equal(loss, loss_own)
    effective = chunk or _flce_chunk_size(TOKENS, H, 96, True, 4 if weight_grad_dtype == torch.float32 else 2)
    bounds = error_bounds(hidden, weight, b, target, 0.1, 0.01, reduction, dloss, effective,
                          weight_grad_dtype != torch.float32)
    for name, got, want, bound in zip(("dhidden", "dweight", "dbias"), grads, grads_own, bounds[1:]):
        assert_within(got, want, bound, name)


@pytest.mark.parametrize("device", DEVICES)
def test_no_grad_computes_no_gradient(device, monkeypatch):
    """Inputs that need no gradient, or torch.no_grad: the loss alone (the logits' gradient, the
    GEMMs behind it and the backward are never reached)."""
    hidden, weight, b, target = make(device, torch.bfloat16, (TOKENS,), 96, True)
    with_grad = llmk.fused_linear_cross_entropy(hidden, weight, target, b, chunk_size=3)

    def fail(*args):
        raise AssertionError("a logits' gradient computed without a gradient to compute")

    monkeypatch.setattr(llmk.ops.loss, "cross_entropy_backward", fail)
    monkeypatch.setattr(llmk.ops.loss, "_cross_entropy_grad_", fail)
    with torch.no_grad():
        loss = llmk.fused_linear_cross_entropy(hidden, weight, target, b, chunk_size=3)
    assert not loss.requires_grad and torch.equal(loss, with_grad.detach())
    for reduction in ("mean", "sum", "none"):
        plain = llmk.fused_linear_cross_entropy(hidden.detach(), weight.detach(), target, b.detach(),
                                                reduction=reduction, chunk_size=3)
        want, _ = reference(hidden, weight, b, target, 0.0, 0.0, reduction)
        assert plain.grad_fn is None and plain.shape == want.shape
        torch.testing.assert_close(plain.double().cpu(), want.detach().cpu(), rtol=0.02, atol=0.05)
    # reduction "none" saves the inputs and computes nothing more in the forward either
    llmk.fused_linear_cross_entropy(hidden, weight, target, b, reduction="none", chunk_size=3)


@pytest.mark.parametrize("device", DEVICES)
def test_only_some_inputs_need_gradients(device):
    """A frozen head (only hidden trains) and frozen features (only the weight): the others get
    no gradient, and the ones asked for are right."""
    for trains in ("hidden", "weight"):
        hidden, weight, b, target = make(device, torch.bfloat16, (TOKENS,), 96, True)
        frozen = [t.requires_grad_(False) for name, t in (("hidden", hidden), ("weight", weight), ("bias", b))
                  if name != trains]
        assert len(frozen) == 2
        loss = llmk.fused_linear_cross_entropy(hidden, weight, target, b, chunk_size=3)
        loss.backward()
        assert all(t.grad is None for t in frozen)
        want, leaves = reference(hidden, weight, b, target, 0.0, 0.0, "mean")
        want.backward()
        got, ref = (hidden, leaves[0]) if trains == "hidden" else (weight, leaves[1])
        bounds = error_bounds(hidden, weight, b, target, 0.0, 0.0, "mean", torch.ones((), device=device), 3)
        assert_within(got.grad, ref.grad, bounds[1 if trains == "hidden" else 2], trains)


@pytest.mark.parametrize(("reduction", "weight_grad_dtype"),
                         [("mean", torch.float32), ("sum", torch.float32), ("none", None), ("none", torch.float32)])
def test_backward_twice(reduction, weight_grad_dtype):
    """retain_graph: a second backward gives the same gradients (the float32 accumulator's saved
    gradients are not scaled in place; "none" computes them in the backward, whatever the
    accumulator)."""
    hidden, weight, b, target = make("cpu", torch.bfloat16, (TOKENS,), 96, True)
    loss = llmk.fused_linear_cross_entropy(hidden, weight, target, b, reduction=reduction, chunk_size=4,
                                           weight_grad_dtype=weight_grad_dtype).sum()
    loss.backward(torch.tensor(0.5), retain_graph=True)
    first = [t.grad.clone() for t in (hidden, weight, b)]
    for t in (hidden, weight, b):
        t.grad = None
    loss.backward(torch.tensor(0.5))
    for f, t in zip(first, (hidden, weight, b)):
        assert torch.equal(f, t.grad)


def round_once(x, dtype):
    """float64 x rounded to dtype once, as llmk's CPU GEMM rounds its float64 sums: to float32 by
    round-to-odd (truncated toward zero, the last bit set when inexact), after which the rounding
    to dtype (to nearest) gives the correctly rounded value; torch's float64 -> bfloat16 rounds
    twice (through float32 to nearest)."""
    f = x.float()
    truncated = torch.where(f.double().abs() > x.abs(), torch.nextafter(f, torch.zeros_like(f)), f)
    odd = (truncated.view(torch.int32) | 1).view(torch.float32)
    return torch.where(truncated.double() == x, truncated, odd).to(dtype)


def logits_gradient(hidden, weight, bias, target, **args):
    """llmk's gradient of the rows' summed losses over the logits, written over them by the loss
    kernel (cross_entropy_grad_, grad_scale 1), as the fused forward computes it per chunk (rows
    are independent: those of the whole batch)."""
    z = llmk.linear(hidden, weight, bias).detach().clone()
    llmk.ops.loss._cross_entropy_grad_(z, target, args.get("ignore_index", -100), args["label_smoothing"],
                                       args["z_loss"])
    return z


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("chunk", [1, 3, 12, 13])
def test_weight_dtype_sum_rounds_once_per_chunk(dtype, chunk):
    """CPU, the weight's gradient summed in its dtype (the default): dweight is the running sum
    S_c = round(S_{c-1} + g_cᵀ h_c), one rounding per chunk (llmk's GEMM adds the residual S_{c-1}
    to its float64 product before it rounds), bit for bit, g_c being the gradient the loss kernel
    writes over the chunk's logits. A float32 accumulator, or a product rounded before it is
    added, gives other bits (a hand run: both fail every case but the single chunk). The loss,
    dhidden and dbias are those of the float32 mode, bit for bit."""
    hidden, weight, b, target = make("cpu", dtype, (TOKENS,), 96, True)
    args = dict(label_smoothing=0.1, z_loss=0.01, reduction="sum")  # upstream 1: the backward scales exactly
    results = []
    for weight_grad_dtype in (torch.float32, None):
        loss = llmk.fused_linear_cross_entropy(hidden, weight, target, b, chunk_size=chunk,
                                               weight_grad_dtype=weight_grad_dtype, **args)
        loss.backward()
        results.append([loss] + [t.grad for t in (hidden, weight, b)])
        for t in (hidden, weight, b):
            t.grad = None
    (loss32, dh32, _, db32), (loss, dh, dw, db) = results
    assert torch.equal(loss, loss32) and torch.equal(dh, dh32) and torch.equal(db, db32)
    dz = logits_gradient(hidden, weight, b, target, **args).double()
    h = hidden.detach().double()
    want = torch.zeros_like(weight)
    for i in range(0, TOKENS, chunk):
        want = round_once(want.double() + dz[i:i + chunk].t() @ h[i:i + chunk], dtype)
    assert dw.dtype == dtype and torch.equal(dw, want)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_weight_dtype_backward_scales_in_place(reduction):
    """The default (the weight's gradient summed in its dtype): the backward scales the gradients
    the forward saved in place, by one float32 factor (the upstream gradient, over the count of
    rows not ignored for "mean": the saved gradients are those of the summed losses), rounding
    once, and hands those buffers on (no second [V, H] while it runs): the leaves' gradients are
    the saved tensors themselves. A second backward (retain_graph) is refused and changes
    nothing; the float32 mode allows it (test_backward_twice)."""
    hidden, weight, b, target = make("cpu", torch.bfloat16, (TOKENS,), 96, True)
    flce = llmk.fused_linear_cross_entropy
    loss = flce(hidden, weight, target, b, chunk_size=4, reduction=reduction)
    saved = [t.data_ptr() for t in loss.grad_fn.saved_tensors]
    factor = torch.tensor(1 / 3)  # not a power of 2: a bf16 factor would round it
    if reduction == "mean":
        factor = factor * torch.reciprocal((target != -100).sum().float())
    want = [(g.float() * factor).to(g.dtype) for g in loss.grad_fn.saved_tensors]
    loss.backward(torch.tensor(1 / 3))
    for w, t, ptr in zip(want, (hidden, weight, b), saved):
        assert t.grad.data_ptr() == ptr and torch.equal(t.grad, w)
    for t in (hidden, weight, b):
        t.grad = None
    loss = flce(hidden, weight, target, b, chunk_size=4, reduction=reduction)
    loss.backward(retain_graph=True)
    first = [t.grad.clone() for t in (hidden, weight, b)]
    with pytest.raises(RuntimeError, match=r"fused_linear_cross_entropy: with the weight's gradient summed in its "
                                           r"dtype \(torch.bfloat16, the default\) .* a second backward through it "
                                           r"\(retain_graph=True\) needs weight_grad_dtype=torch.float32"):
        loss.backward()
    for f, t in zip(first, (hidden, weight, b)):
        assert torch.equal(f, t.grad)


def test_weight_dtype_is_the_default():
    hidden, weight, b, target = make("cpu", torch.bfloat16, (TOKENS,), 96, True)
    grads = []
    for weight_grad_dtype in (None, torch.bfloat16):
        llmk.fused_linear_cross_entropy(hidden, weight, target, b, chunk_size=3,
                                        weight_grad_dtype=weight_grad_dtype).backward()
        grads.append(weight.grad)
        weight.grad = None
    assert torch.equal(*grads)


def test_default_chunk_size():
    # Liger's rule (logits of a chunk ~ hidden's size): 16384 tokens, V 32000, H 4096 -> 2048
    assert _flce_chunk_size(16384, 4096, 32000, False) == 2048
    # the bench shapes: without the weight's gradient Liger's rule (256, 128); with it, summed in
    # bf16 (2 bytes an element), H / 8 (a power of 2) bounds the passes over the sum
    assert _flce_chunk_size(8192, 4096, 128256, False) == 256
    assert _flce_chunk_size(8192, 4096, 128256, True) == 512
    assert _flce_chunk_size(4096, 3584, 152064, False) == 128
    assert _flce_chunk_size(4096, 3584, 152064, True) == 256
    # the float32 accumulator (4 bytes an element): H / 4
    assert _flce_chunk_size(8192, 4096, 128256, True, 4) == 1024
    assert _flce_chunk_size(4096, 3584, 152064, True, 4) == 512
    # short inputs: one chunk (at least 2^25 logits); never more than the tokens
    assert _flce_chunk_size(16, 4096, 128256, True) == 16
    assert _flce_chunk_size(1, 32, 101, False) == 1
    assert _flce_chunk_size(0, 32, 101, True) == 1


def test_empty_batch():
    hidden, weight, b, target = make("cpu", torch.bfloat16, (0,), 96, True, ignored=())
    assert llmk.fused_linear_cross_entropy(hidden, weight, target, b, reduction="sum").item() == 0
    loss = llmk.fused_linear_cross_entropy(hidden, weight, target, b, reduction="none")
    assert loss.shape == (0,)
    llmk.fused_linear_cross_entropy(hidden, weight, target, b, reduction="sum").backward()
    assert hidden.grad.shape == (0, H) and torch.count_nonzero(weight.grad) == 0


def test_bad_arguments():
    hidden, weight, b, target = make("cpu", torch.bfloat16, (TOKENS,), 96, True)
    flce = llmk.fused_linear_cross_entropy
    with pytest.raises(TypeError, match="hidden is float32; the GEMMs take float16 or bfloat16"):
        flce(hidden.float(), weight.float(), target)
    with pytest.raises(TypeError, match="must have hidden's dtype"):
        flce(hidden, weight.half(), target)
    with pytest.raises(ValueError, match="reduction must be one of"):
        flce(hidden, weight, target, reduction="avg")
    with pytest.raises(ValueError, match="do not make a linear layer"):
        flce(hidden, weight[:, :16], target)
    with pytest.raises(ValueError, match="target has shape"):
        flce(hidden, weight, target[:-1])
    with pytest.raises(ValueError, match="bias has shape"):
        flce(hidden, weight, target, b[:-1])
    with pytest.raises(TypeError, match="target is torch.float32"):
        flce(hidden, weight, target.float())
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        flce(hidden, weight, target, chunk_size=0)
    for dtype in (torch.float16, torch.float64, "bfloat16"):
        with pytest.raises(ValueError, match=r"fused_linear_cross_entropy: weight_grad_dtype must be None or the "
                                             r"weight's dtype \(torch.bfloat16: the gradient itself, the default\) or "
                                             rf"torch.float32 \(a float32 accumulator\), got {dtype!r}"):
            flce(hidden, weight, target, weight_grad_dtype=dtype)
    with pytest.raises(RuntimeError, match=r"cross_entropy: target\[0\] = 96 is out of range"):
        flce(hidden, weight, torch.full_like(target, 96))


# --- the GPU's own sizes ---------------------------------------------------------------------------

@requires_cuda
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("chunk", [None, 64, 100, 257])
@pytest.mark.parametrize("weight_grad_dtype", [None, torch.float32])
def test_cuda_gemm_sizes(reduction, chunk, weight_grad_dtype):
    """Chunks of more and fewer than 64 rows (llmk.linear's split-K and tiled kernels for the
    logits), a vocabulary over the tiles (1032), cuBLAS's in-place sums (of the weight's dtype,
    and float32 in slices of the vocabulary)."""
    check("cuda", torch.bfloat16, (257,), 1032, reduction, chunk, True, 0.1, 1e-3, size=128,
          weight_grad_dtype=weight_grad_dtype)


@requires_cuda
@pytest.mark.parametrize("weight_grad_dtype", [None, torch.float32])
def test_cuda_in_place_sum_matches_the_residual_gemm(weight_grad_dtype):
    """The weight's gradient summed in place by cuBLAS (_WeightGrad.add: addmm_, beta 1, or
    addmm(out_dtype=float32) into the float32 slices) against the sum it replaced (llmk.linear
    with the running sum as its residual, copied back; float32: each product rounded to bf16
    by llmk.linear, then added), over 6 chunks of 128 rows at V 2056 (float32 slices of 416 rows
    and a last one of 392), H 256. Both round once per chunk (the weight's dtype) or once at the end (float32),
    so they differ by at most the two rounding bounds: u Σ_c |S_c| each for the running sums
    S_c; for float32 the old products' u Σ_c |P_c| and the two final roundings."""
    vocab, size, chunk, chunks = 2056, 256, 128, 6
    weight = torch.empty(vocab, size, device="cuda", dtype=torch.bfloat16)
    grads = [(torch.randn(chunk, vocab, device="cuda") * 0.1).to(torch.bfloat16) for _ in range(chunks)]
    hiddens = [torch.randn(chunk, size, device="cuda").to(torch.bfloat16) for _ in range(chunks)]
    acc = llmk.ops.loss._WeightGrad(weight, chunk, weight_grad_dtype or weight.dtype)
    old = torch.zeros_like(weight)
    old32 = torch.zeros(vocab, size, device="cuda")
    for g, h in zip(grads, hiddens):
        acc.add(g, h)
        if weight_grad_dtype is None:
            old = llmk.linear(g.t(), h.t(), None, old)
        else:
            old32 += llmk.linear(g.t(), h.t()).float()
    new = acc.result()
    u = 2.0**-8
    products = [g.double().t() @ h.double() for g, h in zip(grads, hiddens)]
    if weight_grad_dtype is None:
        allowed = 2 * u * torch.stack(products).cumsum(0).abs().sum(0)
    else:
        old = old32.to(torch.bfloat16)
        exact = sum(products)
        allowed = u * sum(p.abs() for p in products) + 2 * u * exact.abs()
    err = (new.double() - old.double()).abs()
    assert new.dtype == torch.bfloat16 and (err <= allowed + 1e-30).all(), \
        f"worst err / allowed {(err / allowed).nan_to_num(float('inf')).max().item():.3g}"
    # and not the same by accident: the sum moved away from a single chunk's product
    assert (new.double() - products[-1]).abs().max() > 0.1


@requires_cuda
def test_cuda_peak_memory_is_a_chunk():
    """4096 tokens x V 32000 (bf16 logits: 262 MB): forward + backward stays well under one copy
    of the logits (a chunk's logits and the gradients, dweight 4 MB)."""
    tokens, hidden_size, vocab = 4096, 64, 32000
    hidden = torch.randn(tokens, hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(vocab, hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, vocab, (tokens,), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = llmk.fused_linear_cross_entropy(hidden, weight, target, chunk_size=256)
    loss.backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    assert peak < 0.25 * tokens * vocab * 2, f"peak {peak / 2**20:.1f} MiB"


@requires_cuda
@pytest.mark.parametrize("weight_grad_dtype", [None, torch.float32])
def test_cuda_transient_memory(weight_grad_dtype):
    """What a call needs beyond its inputs and the gradients it returns (the bench's transient
    column), 1024 tokens x H 1024 x V 32000, chunk 256 (4 chunks), "mean". The forward's peak
    above the inputs, less the returned dweight (65.5 MB) and dhidden (2.1 MB), is one chunk of
    logits (256 x 32000 bf16: 16.4 MB; the gradient is written over them, dhidden's rows and
    dweight's sum in place), plus 2 MiB for the loss rows and the allocator's rounding (a block
    may keep up to 1 MiB past its request). The float32 accumulator adds its 4 V H bytes
    (131 MB) and, while it is rounded slice by slice, an eighth of them. The path this replaced
    held the logits, their gradient and a dweight product slice: 49 MB for the weight's dtype.
    The backward scales the saved gradients in place with the weight's dtype (nothing of their
    size); with float32 it writes new ones (2 V H + 2 tokens H bytes), which the leaves keep."""
    tokens, size, vocab, chunk = 1024, 1024, 32000, 256
    hidden = torch.randn(tokens, size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = (torch.randn(vocab, size, device="cuda") * 0.05).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, vocab, (tokens,), device="cuda")

    def call():
        return llmk.fused_linear_cross_entropy(hidden, weight, target, chunk_size=chunk,
                                               weight_grad_dtype=weight_grad_dtype)

    call().backward()  # cuBLAS's workspace and handles: allocated once, before the measurement
    hidden.grad = weight.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = call()
    torch.cuda.synchronize()
    forward_peak = torch.cuda.max_memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    before_backward = torch.cuda.memory_allocated()
    loss.backward()
    torch.cuda.synchronize()
    backward_peak = torch.cuda.max_memory_allocated() - before_backward
    returned = 2 * (vocab * size + tokens * size)
    logits = chunk * vocab * 2
    accumulator = 0 if weight_grad_dtype is None else 4 * vocab * size * 9 // 8
    transient = forward_peak - returned
    assert transient <= logits + accumulator + 2**21, f"transient {transient / 2**20:.1f} MiB"
    allowed_backward = 2**20 if weight_grad_dtype is None else returned + 2**21
    assert backward_peak <= allowed_backward, f"backward peak {backward_peak / 2**20:.1f} MiB"
