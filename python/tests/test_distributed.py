"""llmk.distributed.all_reduce_add_rmsnorm against the unfused sequence's rounded sum and a
float64 RMSNorm of it, on the same inputs: two processes
on the CPU over gloo (every rank checks its results), float32 and bfloat16, one row, ragged
rows and hidden sizes, a batched x, Gemma's offset; argument errors raised before anything is
written, and without an initialized process group. On 2 and 4 GPUs (NCCL, skipped with fewer):
every path (fused, auto, nccl) over decode and ragged shapes and every dtype, the fused path's
results the same bits on every rank, calls captured in a CUDA graph and replayed, and a message
the peer buffers cannot take rejected before anything is written."""

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


def reference(shape, dtype, seed, eps, offset, world=WORLD):
    """The sum as the op rounds it (the ranks' x summed in float32 and rounded to the dtype, as
    the all-reduce of two ranks does and the fused path does for any number; then the add,
    rounded), and the float64 RMSNorm of that rounded sum: the op's only own rounding is the
    norm's output."""
    xs = [inputs(shape, dtype, seed, r)[0] for r in range(world)]
    _, residual, weight = inputs(shape, dtype, seed, 0)
    s = (residual + sum(x.float() for x in xs).to(dtype)).double()
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
    ("eps", "eps must be a finite number > 0"),
    ("residual_is_x", "x and residual overlap in memory"),
    ("strided_residual", "residual's last dim and weight must be contiguous"),
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
    eps = 0.0 if case == "eps" else 1e-6
    if case == "residual_is_x":
        residual = x
    elif case == "strided_residual":
        residual = torch.randn(8, 4).t()
    x0, r0 = x.clone(), residual.clone()
    with pytest.raises((ValueError, TypeError), match=needle.replace("[", r"\[").replace("]", r"\]")):
        llmk.distributed.all_reduce_add_rmsnorm(x, residual, weight, eps)
    assert torch.equal(x, x0) and torch.equal(residual, r0)


def test_path_setting_is_checked(one_rank_group, monkeypatch):
    x = torch.randn(4, 8)
    monkeypatch.setenv("LLMK_ALL_REDUCE_PATH", "fast")
    with pytest.raises(ValueError, match="LLMK_ALL_REDUCE_PATH='fast'; expected one of auto, fused, nccl"):
        llmk.distributed.all_reduce_add_rmsnorm(x, torch.randn(4, 8), torch.ones(8))
    monkeypatch.setenv("LLMK_ALL_REDUCE_PATH", "fused")
    with pytest.raises(ValueError, match="x is not a CUDA tensor"):
        llmk.distributed.all_reduce_add_rmsnorm(x, torch.randn(4, 8), torch.ones(8))
    monkeypatch.setenv("LLMK_ALL_REDUCE_PATH", "auto")
    assert llmk.distributed.all_reduce_path(x) == "nccl"


# GPU: shapes of decode (1-128 tokens at Llama's hidden sizes), ragged ones, and one past the
# peer buffers' 4 MiB in float32 (auto takes NCCL there).
GPU_SHAPES = [(1, 4096), (8, 8192), (128, 8192), (3, 5, 1000), (17, 264), (160, 8192)]
GPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _same_on_every_rank(t, what):
    gathered = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, t)
    assert all(torch.equal(g, t) for g in gathered), f"{what} differs between ranks"


def _gpu_cases(rank, world, setting):
    os.environ["LLMK_ALL_REDUCE_PATH"] = setting
    for seed, (shape, dtype) in enumerate((s, d) for s in GPU_SHAPES for d in GPU_DTYPES):
        if setting == "fused" and torch.Size(shape).numel() * dtype.itemsize > llmk.distributed.DEFAULT_CAPACITY:
            continue
        eps, offset = 1e-5, (1.0 if seed % 4 == 1 else 0.0)
        x, residual, weight = (t.cuda() for t in inputs(shape, dtype, seed, rank))
        path = llmk.distributed.all_reduce_path(x)
        llmk.distributed.all_reduce_add_rmsnorm(x, residual, weight, eps, offset=offset)
        y, s = reference(shape, dtype, seed, eps, offset, world)
        what = f"rank {rank} {setting} ({path}) {shape} {dtype}"
        # NCCL sums more than two ranks in its own order, rounding partial sums: a step of the
        # dtype at the terms' scale (the sum may cancel to far below them).
        exact = path == "fused" or world == 2
        res_rtol = RTOL[dtype] / 4 if exact else RTOL[dtype]
        terms = residual.abs().max().item() + world * 5.0  # |x| < 5 here
        assert_close(residual, s, res_rtol, f"{what} residual", atol=None if exact else res_rtol * terms)
        if not exact:  # the norm of the residual NCCL's sum gave
            s = residual.double()
            y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * (offset + weight.double())
        assert_close(x, y, RTOL[dtype] + res_rtol, f"{what} out")
        if path == "fused":
            _same_on_every_rank(residual, f"{what} residual")
            _same_on_every_rank(x, f"{what} out")


def _graph_replays(rank, world):
    """Three fused calls captured into a CUDA graph, replayed twice, against the same calls eager."""
    os.environ["LLMK_ALL_REDUCE_PATH"] = "fused"
    x, residual, weight = (t.cuda() for t in inputs((4, 4096), torch.bfloat16, 99, rank))
    start = (x.clone(), residual.clone())
    llmk.distributed.setup_peer_group()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(3):
            llmk.distributed.all_reduce_add_rmsnorm(x, residual, weight)
    for _ in range(2):
        x.copy_(start[0])
        residual.copy_(start[1])
        graph.replay()
        got = (x.clone(), residual.clone())
        x.copy_(start[0])
        residual.copy_(start[1])
        for _ in range(3):
            llmk.distributed.all_reduce_add_rmsnorm(x, residual, weight)
        assert torch.equal(got[0], x) and torch.equal(got[1], residual), f"rank {rank}: replay differs from eager"


def _too_large_writes_nothing(rank):
    os.environ["LLMK_ALL_REDUCE_PATH"] = "fused"
    x = torch.randn(1024, 8192, device="cuda")
    residual, x0 = torch.randn_like(x), x.clone()
    r0 = residual.clone()
    with pytest.raises(ValueError, match="more than the peer buffers'"):
        llmk.distributed.all_reduce_add_rmsnorm(x, residual, torch.ones(8192, device="cuda"))
    assert torch.equal(x, x0) and torch.equal(residual, r0)


def _gpu_rank(rank, path, failures, world):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{path}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    try:
        for setting in ("fused", "auto", "nccl"):
            _gpu_cases(rank, world, setting)
        _graph_replays(rank, world)
        _too_large_writes_nothing(rank)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - the parent reports each rank's failure
        failures.put(f"rank {rank}: {type(e).__name__}: {e}")
    finally:
        llmk.distributed.release_peer_groups()
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_gpu_ranks_match_float64(world, monkeypatch):
    if torch.cuda.device_count() < world:
        pytest.skip(f"{world} GPUs needed, {torch.cuda.device_count()} present")
    for k, v in NO_MULTICAST.items():
        monkeypatch.setenv(k, v)
    run_ranks(_gpu_rank, world, world)
