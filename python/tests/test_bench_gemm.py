"""The benchmark harness's gemm suite (bench/llmk_bench/suites/gemm.py) on the CPU backend at
its small shapes: the fused epilogues and the training step (gemm_train: the forward and both
gradients through autograd), one row per impl and case, llmk's error at the reference's, and the
table rebuilt from the CSV. The GPU run is the device's."""

import pytest

import llmk  # noqa: F401  (registers torch.ops.llmk)
from bench_cli import ROOT, bench, csv_rows
from conftest import HAS_CUDA


@pytest.mark.skipif(HAS_CUDA, reason="the CPU backend's run; on a GPU the suite times the GPU kernels")
def test_gemm_suite_fused_and_train_on_the_cpu(tmp_path):
    bench("--op", "gemm", "--gemm-parts", "fused", "train", "--csv", tmp_path / "g.csv", cwd=tmp_path)
    rows = csv_rows(tmp_path / "g.csv")
    cases = {}
    for r in rows:
        assert r["dtype"] == "bfloat16" and r["tokens"] == "64"
        cases.setdefault(r["op"], {})[r["impl"]] = r
    assert set(cases) == {"gemm_bias", "gemm_residual", "gemm_silu_mul", "gemm_gelu", "gemm_train"}
    train = cases["gemm_train"]
    assert set(train) == {"llmk", "torch"}  # no compile impl off the GPU
    for row in train.values():
        assert row["shape"] == "cpu_512x256" and row["k"] == "256" and float(row["time_us"]) > 0
        assert float(row["max_rel_err"]) < 1e-2  # dx against float64
        # three products of 2 M N K FLOPs over the time
        assert float(row["tflops"]) == pytest.approx(3 * 2 * 64 * 512 * 256 / float(row["time_us"]) / 1e6, rel=0.02)
    assert set(cases["gemm_silu_mul"]) == {"llmk", "unfused"}
    table = bench("--from-csv", tmp_path / "g.csv", cwd=tmp_path)
    assert "| gemm_train | cpu_512x256 | 64 | 512 | 256 |" in table and "vs compile" in table


def test_gemm_shape_names_limit_every_part(monkeypatch):
    """--gemm-shapes names any part's shapes (a training-only one included) and every part keeps
    only those; a group takes its model's shapes of every part; an unknown name is refused (the
    GPU run's selection, read directly: on the CPU the suite runs its own small shapes)."""
    import argparse

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from llmk_bench.suites import gemm

    def select(*names, parts=gemm.PARTS, tokens=None):
        args = argparse.Namespace(gemm_shapes=list(names), gemm_parts=list(parts), tokens=tokens)
        return gemm._selection(args, "cuda")

    plain, fused, rl = select("llama3_8b_up", tokens=[64, 2048])
    assert plain == [] and rl == [] and fused == [("gemm_train", "llama3_8b_up", 2048, 14336, 4096)]
    plain, fused, rl = select("llama3_8b_gate_up", parts=("plain", "fused", "rmsnorm_linear"), tokens=[64, 2048])
    assert {c[0] for c in plain} == {"llama3_8b_gate_up"} and {c[1] for c in fused} == {"llama3_8b_gate_up"}
    assert [c[:3] for c in rl] == [("rmsnorm_linear", "llama3_8b_gate_up", 64)]
    _, fused, _ = select("llama", parts=("train",), tokens=[2048])
    assert {c[1] for c in fused} == set(gemm.TRAIN)
    with pytest.raises(ValueError, match="unknown shapes"):
        select("llama3_8b_nope")
