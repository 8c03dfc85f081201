"""One test per problem a new user hit (issue 10's list), so none comes back. Items fixed in
the C++ library have their own C++ tests too (tests/cpp); these check what a Python user sees."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import llmk
from conftest import DEVICES, HAS_CUDA

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("device", DEVICES)
def test_rope_rot_dim_is_honoured_or_rejected(device):
    """rot_dim=30 with a 64-column cache was silently ignored; now it is rejected, and so are
    theta and llama3_scaling given beside a cache (the cache holds the angles)."""
    q = torch.randn(5, 2, 64, device=device)
    positions = torch.arange(5, device=device)
    cache = llmk.rope_cos_sin_cache(16, 64, device=device)
    before = q.clone()
    with pytest.raises(RuntimeError, match=r"rope_: rot_dim 30 does not match the 64 columns of cos_sin_cache"):
        llmk.rope_(q, None, positions, cache, rot_dim=30)
    with pytest.raises(RuntimeError, match=r"rope_: theta \(500000\) and cos_sin_cache were both given"):
        llmk.rope_(q, None, positions, cache, theta=500000.0)
    with pytest.raises(RuntimeError, match="rope: llama3_scaling applies to angles computed from theta"):
        llmk.rope(q, None, positions, cache, llama3_scaling={"factor": 8.0, "low_freq_factor": 1.0,
                                                              "high_freq_factor": 4.0,
                                                              "original_max_position_embeddings": 8192})
    assert torch.equal(q, before)
    llmk.rope_(q, None, positions, cache, rot_dim=64)  # the cache's own width is accepted
    partial = q.clone()
    llmk.rope_(partial, None, positions, rot_dim=30)  # and rot_dim is honoured with theta
    assert torch.equal(partial[..., 30:], q[..., 30:]) and not torch.equal(partial[..., :30], q[..., :30])


def test_unsupported_dtype_names_op_argument_and_dtype():
    x = torch.randn(3, 64, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r"rmsnorm: x is float64; llmk takes float32, float16, bfloat16"):
        llmk.rmsnorm(x, torch.ones(64))
    with pytest.raises(RuntimeError, match=r"softmax: x is complex64; llmk takes float32, float16, bfloat16"):
        llmk.softmax(torch.ones(3, 4, dtype=torch.complex64))
    with pytest.raises(RuntimeError, match=r"softmax: x has unsupported dtype int64 \(expected float32"):
        llmk.softmax(torch.ones(3, 4, dtype=torch.int64))


@pytest.mark.parametrize("op", ["rmsnorm", "layernorm", "bias_gelu"])
@pytest.mark.parametrize("bad", [(2, 64), ()])
def test_vector_shape_message_says_what_was_passed(op, bad):
    x = torch.randn(3, 64)
    w = torch.randn(bad)
    got = "[2, 64]" if bad else "[]"
    with pytest.raises(RuntimeError, match=rf"{op}: (weight|bias) must have shape \[64\], got {re.escape(got)}"):
        getattr(llmk, op)(x, w)


def test_shape_messages_show_the_bad_values():
    with pytest.raises(RuntimeError, match=r"swiglu: up .*\[3, 32\].*\[3, 64\]|swiglu: up .*\[3, 64\].*\[3, 32\]"):
        llmk.swiglu(torch.randn(3, 64), torch.randn(3, 32))
    q, k = torch.randn(7, 2, 64), torch.randn(7, 1, 32)
    with pytest.raises(RuntimeError, match=r"rope_: k .*\[7, 1, 32\]"):
        llmk.rope_(q, k, torch.arange(7))
    with pytest.raises(RuntimeError, match=r"rope_: positions must have q's leading dims \(\[tokens\] = \[7\]\), got \[5\]"):
        llmk.rope_(q, None, torch.arange(5))


@pytest.mark.skipif(HAS_CUDA, reason="checks the message on a machine without a GPU")
def test_no_gpu_is_reported_plainly():
    """Without a GPU, torch itself refuses CUDA tensors before llmk sees one; llmk's own CUDA
    path (a CUDA view in the C++ API) says so plainly: tests/cpp/tensor_test.cc checks that
    message. Here: what llmk reports about the machine."""
    info = llmk.device_info()
    assert not info["available"]
    assert "no CUDA device" in info["error"], info["error"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_fp32_softmax_keeps_fp32_accuracy_on_large_logits(device, scale):
    """|x * scale| ~ 1e3: the error against float64 is at most 2x torch's own (plus a few ulps)."""
    x = torch.randn(64, 1000, device=device) * (1000.0 / scale)
    for ours, theirs in ((llmk.softmax, torch.softmax), (llmk.log_softmax, torch.log_softmax)):
        want = theirs(x.double() * scale, -1)
        got_err = (ours(x, scale).double() - want).abs().max().item()
        torch_err = (theirs(x * scale, -1).double() - want).abs().max().item()
        assert got_err <= 2 * torch_err + 4 * torch.finfo(torch.float32).eps * want.abs().max().item(), (
            f"{ours.__name__}: error {got_err:.3g}, torch's {torch_err:.3g}")


@pytest.mark.parametrize("device", DEVICES)
def test_log_softmax_of_one_column_is_zero(device):
    x = torch.randn(17, 1, device=device) * 100
    assert torch.equal(llmk.log_softmax(x, 0.37), torch.zeros_like(x))
    assert torch.equal(llmk.softmax(x, 0.37), torch.ones_like(x))


@pytest.mark.skipif(HAS_CUDA, reason="the GPU benchmark is the long run of `make bench`; this checks the CPU one")
def test_bench_without_gpu_writes_table_and_plot(tmp_path):
    files = {k: tmp_path / f"bench.{k}" for k in ("csv", "md", "png")}
    out = subprocess.run([sys.executable, "-m", "llmk_bench", "--op", "rmsnorm", "--op", "softmax", "--op", "overhead",
                          "--csv", files["csv"], "--table", files["md"], "--plot", files["png"]], check=True,
                         cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(ROOT / "bench")])})
    table = files["md"].read_text()
    assert "softmax" in table and "rmsnorm" in table
    assert files["png"].stat().st_size > 1000 and files["csv"].read_text().count("\n") > 3
    # The run ends by saying where each file went, and checks no GPU limits on the CPU.
    tail = out.stdout[out.stdout.rindex("wrote:"):]
    assert all(str(f) in tail for f in files.values()), tail
    assert "limit" not in table and "**no**" not in out.stdout


def _python_snippets(path: Path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("snippet", _python_snippets(ROOT / "README.md"))
def test_readme_python_snippets_run_as_written(snippet):
    exec(compile(snippet, "README.md", "exec"), {})


@pytest.mark.skipif(not os.environ.get("LLMK_BUILD_DIR"), reason="needs the build dir (make test sets LLMK_BUILD_DIR)")
def test_wheel_holds_only_the_llmk_package(tmp_path):
    """The wheel installs CMake's `python` component (pyproject.toml): llmk/_C and nothing
    else; the C++ library and headers come from a plain `cmake --install`."""
    subprocess.run(["cmake", "--install", os.environ["LLMK_BUILD_DIR"], "--component", "python", "--prefix",
                    str(tmp_path)], check=True, capture_output=True)
    installed = [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()]
    assert len(installed) == 1 and re.fullmatch(r"llmk/_C\..*so", installed[0]), installed
    assert 'install.components = ["python"]' in (ROOT / "pyproject.toml").read_text()


def test_bench_and_test_share_one_build_configuration():
    """`make bench` then `make test` configure the build identically (it builds once)."""
    def configure_line(target):
        out = subprocess.run(["make", "-n", target, "PY=python3"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
        return next(line for line in out.splitlines() if line.strip().startswith("cmake -S"))

    assert configure_line("bench") == configure_line("test")


def test_cuda_cases_are_collected_and_skipped_with_a_reason():
    """Without a GPU the CUDA parametrizations exist and skip (as ctest's do), not vanish."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", str(ROOT / "python/tests/test_rmsnorm.py")],
                         capture_output=True, text=True, cwd=ROOT / "python/tests",
                         env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    assert "[cuda" in out.stdout or "-cuda" in out.stdout, out.stdout[-2000:]
