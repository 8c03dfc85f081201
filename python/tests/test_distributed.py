"""llmk.distributed.all_reduce_add_rmsnorm against the unfused sequence's rounded sum and a
float64 RMSNorm of it, on the same inputs: two processes
on the CPU over gloo (every rank checks its results), float32 and bfloat16, one row, ragged
rows and hidden sizes, a batched x, Gemma's offset; argument errors raised before anything is
written, and without an initialized process group."""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist

import llmk
from conftest import RTOL, assert_close
from ranks import run_ranks

WORLD = 2
SHAPES = [(1, 4096), (3, 1000), (17, 257), (2, 5, 64)]


def inputs(shape, dtype, seed, rank):
    """Rank `rank`'s x and the ranks' shared residual and weight, from `seed` alone, so that any
    rank can rebuild every rank's inputs for the reference."""
    g = torch.Generator().manual_seed(seed * 1000 + 17)
    residual = torch.randn(shape, generator=g).to(dtype)
    weight = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(dtype)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed * 1000 + rank)).to(dtype)
    return x, residual, weight


def reference(shape, dtype, seed, eps, offset):
    """The sum as the unfused sequence rounds it (the ranks' x summed and rounded to the dtype,
    as the all-reduce does with two ranks; then the add, rounded), and the float64 RMSNorm of
    that rounded sum: the op's only own rounding is the norm's output."""
    xs = [inputs(shape, dtype, seed, r)[0] for r in range(WORLD)]
    _, residual, weight = inputs(shape, dtype, seed, 0)
    s = (residual + (xs[0] + xs[1])).double()
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * (offset + weight.double())
    return y, s


def _rank(rank, path, failures):
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=WORLD)
    try:
        for seed, (shape, dtype) in enumerate((s, d) for s in SHAPES for d in (torch.float32, torch.bfloat16)):
            eps, offset = 1e-6, (1.0 if seed % 3 == 0 else 0.0)
            x, residual, weight = inputs(shape, dtype, seed, rank)
            out_x, out_residual = llmk.distributed.all_reduce_add_rmsnorm(x, residual, weight, eps, offset=offset)
            assert out_x is x and out_residual is residual
            y, s = reference(shape, dtype, seed, eps, offset)
            assert_close(residual, s, RTOL[dtype] / 4, f"rank {rank} {shape} {dtype} residual")
            assert_close(x, y, RTOL[dtype], f"rank {rank} {shape} {dtype} out")
    except Exception as e:  # noqa: BLE001 - the parent reports each rank's failure
        failures.put(f"rank {rank}: {type(e).__name__}: {e}")
    finally:
        dist.destroy_process_group()


def test_two_ranks_over_gloo_match_float64():
    run_ranks(_rank, WORLD)


def test_without_a_process_group():
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="all_reduce_add_rmsnorm: torch.distributed is not initialized"):
        llmk.distributed.all_reduce_add_rmsnorm(x, torch.randn(2, 8), torch.ones(8))


@pytest.fixture
def one_rank_group():
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'r')}", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


@pytest.mark.parametrize("case,needle", [
    ("weight_shape", "weight must be [hidden] = [8]"),
    ("weight_dtype", "weight must be on x's device"),
    ("residual_shape", "residual must match x"),
    ("strided_x", "x must be a contiguous tensor"),
    ("int_x", "x has dtype torch.int32"),
])
def test_bad_arguments_write_nothing(one_rank_group, case, needle):
    x, residual, weight = torch.randn(4, 8), torch.randn(4, 8), torch.ones(8)
    if case == "weight_shape":
        weight = torch.ones(9)
    elif case == "weight_dtype":
        weight = torch.ones(8, dtype=torch.float64)
    elif case == "residual_shape":
        residual = torch.randn(4, 9)
    elif case == "strided_x":
        x = torch.randn(8, 4).t()
    elif case == "int_x":
        x = torch.ones(4, 8, dtype=torch.int32)
    x0, r0 = x.clone(), residual.clone()
    with pytest.raises((ValueError, TypeError), match=needle.replace("[", r"\[").replace("]", r"\]")):
        llmk.distributed.all_reduce_add_rmsnorm(x, residual, weight)
    assert torch.equal(x, x0) and torch.equal(residual, r0)
