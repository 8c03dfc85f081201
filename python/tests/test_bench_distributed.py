"""The benchmark harness's tensor-parallel suites (bench/llmk_bench/suites/distributed.py and
e2e_tp.py) on the CPU: their processes over gloo at small shapes, one row per impl and case with
the suites' columns, llmk's results at the unfused sequence's error, and the tables rebuilt from
the CSVs. The GPU runs (NCCL, several GPUs) are the device's."""

import pytest

import llmk  # noqa: F401  (registers torch.ops.llmk)
from bench_cli import csv_rows
from bench_cli import bench as run_bench
from conftest import HAS_CUDA

CPU_ONLY = pytest.mark.skipif(HAS_CUDA, reason="the CPU processes' run; on GPUs the suites are the benchmark")


def bench(*args, cwd):
    return run_bench(*args, cwd=cwd, timeout=600)  # spawned processes over gloo


@CPU_ONLY
def test_all_reduce_suite_over_gloo(tmp_path):
    bench("--op", "all_reduce_add_rmsnorm", "--world", 2, "--csv", tmp_path / "ar.csv", cwd=tmp_path)
    rows = csv_rows(tmp_path / "ar.csv")
    cases = {}
    for r in rows:
        assert r["op"] == "all_reduce_add_rmsnorm" and r["world"] == "2" and r["path"] == "gloo"
        cases.setdefault((r["tokens"], r["hidden"]), {})[r["impl"]] = r
    assert len(cases) == 2, cases.keys()
    for case, impls in cases.items():
        assert set(impls) == {"llmk", "gloo_unfused"}, (case, set(impls))
        assert float(impls["llmk"]["max_rel_err"]) <= float(impls["gloo_unfused"]["max_rel_err"]) * 1.01 + 1e-6
        assert float(impls["llmk"]["time_us"]) > 0
    assert "### all_reduce_add_rmsnorm, world 2" in bench("--from-csv", tmp_path / "ar.csv", cwd=tmp_path)


@CPU_ONLY
def test_e2e_tp_suite_over_gloo(tmp_path):
    bench("--op", "e2e_tp", "--world", 2, "--csv", tmp_path / "tp.csv", cwd=tmp_path)
    rows = csv_rows(tmp_path / "tp.csv")
    phases = {(r["phase"], r["impl"]) for r in rows}
    assert {("decode", "hf_tp"), ("decode", "llmk"), ("decode", "llmk_decode"), ("prefill", "hf_tp"),
            ("prefill", "llmk")} <= phases, phases
    for r in rows:
        assert r["op"] == "e2e_tp" and r["world"] == "2"
        if r["impl"] != "hf_tp":  # llmk.patch fused every layer's all-reduces
            assert r["tp_fused"] == r["layers"], r
    assert "e2e tensor-parallel" in bench("--from-csv", tmp_path / "tp.csv", cwd=tmp_path)
