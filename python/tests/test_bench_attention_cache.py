"""The benchmark harness's attention_cache suite (bench/llmk_bench/suites/attention_cache.py) on
the CPU backend at its small shapes: a row per impl and case (a prefill chunk over a paged cache,
a contiguous one and dense K/V), llmk's error at the float64 reference's. The GPU run is the
device's."""

import pytest

import llmk  # noqa: F401  (registers torch.ops.llmk)
from bench_cli import bench, csv_rows
from conftest import HAS_CUDA


@pytest.mark.skipif(HAS_CUDA, reason="the CPU backend's run; on a GPU the suite times the GPU kernels")
def test_paged_prefill_suite_on_the_cpu(tmp_path):
    bench("--op", "attention_paged_prefill", "--csv", tmp_path / "p.csv", cwd=tmp_path)
    rows = csv_rows(tmp_path / "p.csv")
    impls = {(r["tokens"], r["hidden"], r["impl"]) for r in rows}
    cases = {(t, h) for t in ("80", "200") for h in ("0", "100")}
    assert impls == {(t, h, impl) for t, h in cases for impl in ("llmk", "llmk_page128", "llmk_contiguous", "llmk_dense")}
    for r in rows:
        assert r["op"] == "attention_paged_prefill" and float(r["time_us"]) > 0
        assert float(r["max_rel_err"]) < 1e-2, (r["tokens"], r["hidden"], r["impl"], r["max_rel_err"])
