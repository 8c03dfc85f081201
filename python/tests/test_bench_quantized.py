"""The benchmark harness's quantized_linear suite (bench/llmk_bench/suites/quantized.py) on the
CPU backend at its small shapes: one row per impl and case with the suite's columns, llmk's
error at the reference's, and the table rebuilt from the CSV. The GPU run is the device's."""

import pytest
import torch

import llmk  # noqa: F401  (registers torch.ops.llmk)
from bench_cli import bench, csv_rows
from conftest import HAS_CUDA
HAS_OP = hasattr(torch.ops.llmk, "quantized_linear") and torch._C._dispatch_has_kernel_for_dispatch_key(
    "llmk::quantized_linear", "CPU")


@pytest.mark.skipif(HAS_CUDA, reason="the CPU backend's run; on a GPU the suite times the GPU kernels")
@pytest.mark.skipif(not HAS_OP, reason="llmk._C without the quantized_linear CPU kernel")
def test_quantized_suite_on_the_cpu(tmp_path):
    bench("--op", "quantized_linear", "--qlinear-m", 1, 16, "--csv", tmp_path / "q.csv", cwd=tmp_path)
    rows = csv_rows(tmp_path / "q.csv")
    cases = {}
    for r in rows:
        assert r["op"] == "quantized_linear" and r["dtype"] == "bfloat16"
        cases.setdefault((r["shape"], r["bits"], r["tokens"]), {})[r["impl"]] = r
    assert len(cases) == 2 * 2 * 2  # two shapes, two formats, two M
    for (shape, bits, m), impls in cases.items():
        peer = "int4pack" if bits == "4" else "int8pack"
        assert set(impls) == {"llmk", "torch_bf16", peer}, (shape, bits, m, set(impls))
        llmk_row = impls["llmk"]
        assert int(llmk_row["group"]) == (128 if bits == "4" else int(llmk_row["k"]))
        assert float(llmk_row["max_rel_err"]) < 1e-2 and float(llmk_row["time_us"]) > 0
        assert llmk_row["gbs"] != ""  # M <= 64: the weight bytes over the time
    table = bench("--from-csv", tmp_path / "q.csv", cwd=tmp_path)
    assert "### quantized_linear int4 g128" in table and "### quantized_linear int8 per channel" in table
