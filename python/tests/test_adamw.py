"""llmk.optim.AdamW (torch.ops.llmk.adamw_step_): 100 steps against torch.optim.AdamW on
fp32 parameters (weight decay, maximize, param groups, tensor lr, parameters without
gradients), bf16 parameters with fp32 state against a float64 reference, CUDA-graph
capture and replay, opcheck, bad inputs."""

import copy

import pytest
import torch

import llmk
from conftest import DEVICES, HAS_CUDA, requires_cuda

SHAPES = [(64, 33), (33,), (5, 7, 9), (1,), (4097,), (128, 256)]


def make_params(device, dtype=torch.float32):
    return [torch.randn(s, device=device, dtype=dtype) for s in SHAPES]


def run_both(device, steps, options, groups=None, skip=()):
    """Runs llmk.optim.AdamW and torch.optim.AdamW from the same start on the same grads."""
    ours = [p.clone().requires_grad_() for p in make_params(device)]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    if groups:
        opt_a = llmk.optim.AdamW([{"params": ours[:3], **groups[0]}, {"params": ours[3:], **groups[1]}], **options)
        opt_b = torch.optim.AdamW([{"params": theirs[:3], **groups[0]}, {"params": theirs[3:], **groups[1]}],
                                  **options)
    else:
        opt_a, opt_b = llmk.optim.AdamW(ours, **options), torch.optim.AdamW(theirs, **options)
    for step in range(steps):
        for i, (a, b) in enumerate(zip(ours, theirs)):
            if i in skip and step % 2:
                a.grad = b.grad = None  # no gradient this step: skipped, step count unchanged
                continue
            g = torch.randn_like(a)
            a.grad, b.grad = g.clone(), g.clone()
        opt_a.step()
        opt_b.step()
    return ours, theirs, opt_a, opt_b


def assert_params_close(ours, theirs, tol=1e-5):
    for a, b in zip(ours, theirs):
        err = (a.detach().double() - b.detach().double()).abs().max().item()
        assert err <= tol * (1 + b.detach().abs().max().item()), f"max abs difference {err:.3g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("options", [dict(), dict(lr=3e-3, weight_decay=0.1, betas=(0.8, 0.95), eps=1e-6),
                                     dict(lr=1e-3, weight_decay=0.0, maximize=True)])
def test_matches_torch_adamw_over_100_steps(device, options):
    ours, theirs, opt_a, opt_b = run_both(device, 100, options)
    assert_params_close(ours, theirs)
    for a, b in zip(ours, theirs):
        for key in ("exp_avg", "exp_avg_sq"):
            assert_params_close([opt_a.state[a][key]], [opt_b.state[b][key]])
        assert opt_a.state[a]["step"].item() == 100


@pytest.mark.parametrize("device", DEVICES)
def test_groups_skipped_params_and_tensor_lr(device):
    groups = [dict(lr=1e-2, weight_decay=0.0), dict(lr=2e-3)]
    ours, theirs, opt_a, _ = run_both(device, 20, dict(weight_decay=0.05), groups=groups, skip=(1, 4))
    assert_params_close(ours, theirs)
    assert opt_a.state[ours[1]]["step"].item() == 10 and opt_a.state[ours[0]]["step"].item() == 20
    # lr as a tensor on the device (what graph replay needs) gives the same update.
    p = torch.randn(300, device=device)
    a, b = p.clone().requires_grad_(), p.clone().requires_grad_()
    opt_t = llmk.optim.AdamW([a], lr=torch.tensor(2.0**-8, device=device))  # exact in float32
    opt_f = llmk.optim.AdamW([b], lr=2.0**-8)
    for _ in range(5):
        g = torch.randn_like(p)
        a.grad, b.grad = g.clone(), g.clone()
        opt_t.step()
        opt_f.step()
    assert torch.equal(a, b)


def adamw_ref(p, grads, lr, betas, eps, wd):
    """Float64 AdamW whose parameter is rounded to its dtype after every step (as stored)."""
    m = torch.zeros_like(p, dtype=torch.float64)
    v = torch.zeros_like(m)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        x = p.double() * (1 - lr * wd)
        x = x - lr / (1 - betas[0] ** t) * m / ((v / (1 - betas[1] ** t)).sqrt() + eps)
        p = x.to(p.dtype)
    return p


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_params_keep_fp32_state(device, dtype):
    p0 = torch.randn(3000, device=device, dtype=dtype)
    p = p0.clone().requires_grad_()
    opt = llmk.optim.AdamW([p], lr=1e-2, weight_decay=0.1)
    grads = [torch.randn_like(p0) for _ in range(10)]
    for g in grads:
        p.grad = g
        opt.step()
    assert opt.state[p]["exp_avg"].dtype == torch.float32 and p.dtype == dtype
    want = adamw_ref(p0, grads, 1e-2, (0.9, 0.999), 1e-8, 0.1)
    # Each step rounds p once; where fp32 and float64 round a step differently the 1-ulp
    # difference (of |p| at that step, up to ~4) carries over: a few ulps of max(|p|, 1).
    # A wrong update is off by ~lr = 1e-2 per step.
    ulp = 2.0 ** (-7 if dtype == torch.bfloat16 else -10)
    assert ((p.detach().double() - want.double()).abs() <= 4 * ulp * want.double().abs().clamp(min=1)).all()


@requires_cuda
def test_cuda_graph_capture_and_replay():
    params = [p.requires_grad_() for p in make_params("cuda")]
    eager = [p.detach().clone().requires_grad_() for p in params]
    lr = torch.tensor(1e-3, device="cuda")
    opt = llmk.optim.AdamW(params, lr=lr, weight_decay=0.01)
    opt_eager = llmk.optim.AdamW(eager, lr=1e-3, weight_decay=0.01)
    grads = [torch.zeros_like(p) for p in params]
    for p, g in zip(params, grads):
        p.grad = g
    opt.step()  # the state exists before the capture
    for p in eager:
        p.grad = torch.zeros_like(p)
    opt_eager.step()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        opt.step()
    for step in range(5):
        new_lr = 1e-3 * (step + 2)
        for g, e in zip(grads, eager):
            g.copy_(torch.randn_like(g))
            e.grad = g.clone()
        lr.fill_(new_lr)
        graph.replay()
        for group in opt_eager.param_groups:
            group["lr"] = new_lr
        opt_eager.step()
    torch.cuda.synchronize()
    for a, b in zip(params, eager):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(device):
    with pytest.raises(ValueError, match="Invalid beta parameters"):
        llmk.optim.AdamW([torch.randn(3, device=device)], betas=(0.9, 1.0))
    q = torch.randn(10, device=device)
    m = torch.zeros(10, device=device)
    step = torch.ones((), device=device)
    before = q.clone()
    with pytest.raises(RuntimeError, match=r"adamw_step_: params\[0\].grad has dtype float16, expected float32"):
        torch.ops.llmk.adamw_step_([q], [q.half()], [m], [m.clone()], [step], 1e-3, None, 0.9, 0.999, 1e-8, 0.0,
                                   False)
    with pytest.raises(RuntimeError, match=r"adamw_step_: params\[0\].exp_avg_sq has shape \[9\]"):
        torch.ops.llmk.adamw_step_([q], [q.clone()], [m], [m[:9].clone()], [step], 1e-3, None, 0.9, 0.999, 1e-8,
                                   0.0, False)
    assert torch.equal(q, before) and not m.any()
    with pytest.raises(RuntimeError, match="same length"):
        torch.ops.llmk.adamw_step_([q], [q.clone()], [m], [m.clone()], [], 1e-3, None, 0.9, 0.999, 1e-8, 0.0, False)
    if HAS_CUDA and device == "cuda":
        with pytest.raises(RuntimeError, match=r"params\[0\].step is on cpu:0 but params\[0\].param is on cuda:0"):
            torch.ops.llmk.adamw_step_([q], [q.clone()], [m], [m.clone()], [torch.ones(())], 1e-3, None, 0.9, 0.999,
                                       1e-8, 0.0, False)
    llmk.optim.AdamW([torch.randn(0, device=device, requires_grad=True)]).step()  # no grads: nothing to do


def test_state_dict_round_trip():
    ours, _, opt_a, _ = run_both("cpu", 3, dict(lr=1e-2))
    clone = llmk.optim.AdamW(ours, lr=1e-2)
    clone.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    assert clone.state[ours[0]]["step"].item() == 3
