"""The benchmark harness's A/B flags (tools/gpu_ab.sh drives them on the GPU machine): --impls
keeps llmk and the named peers, --variant labels every row, --ab-summary compares the labelled
runs. Checked on the CPU backend at a small shape (the GPU run is the device's)."""

import pytest

from bench_cli import bench
from bench_cli import csv_rows as rows
from conftest import HAS_CUDA


@pytest.mark.skipif(HAS_CUDA, reason="the CPU backend's run; on a GPU the same flags time the GPU kernels")
def test_variant_runs_of_llmk_alone_and_their_summary(tmp_path):
    shape = ["--op", "rmsnorm", "--tokens", "4", "--hidden", "64", "96"]
    for variant in ("base", "new"):
        bench(*shape, "--impls", "--variant", variant, "--csv", tmp_path / f"{variant}.csv", cwd=tmp_path)
    new = rows(tmp_path / "new.csv")
    assert {r["impl"] for r in new} == {"llmk"} and {r["variant"] for r in new} == {"new"}
    assert sorted(int(r["hidden"]) for r in new) == [64, 96]
    summary = bench("--ab-summary", tmp_path / "base.csv", tmp_path / "new.csv", cwd=tmp_path).splitlines()
    assert summary[0].startswith("| op | dtype | tokens x hidden | base us | new us | base / new |")
    assert len(summary) == 4 and all(line.startswith("| rmsnorm | bfloat16 | 4 x ") and line.endswith("x |")
                                     for line in summary[2:])


@pytest.mark.skipif(HAS_CUDA, reason="the CPU backend's run; on a GPU the same flags time the GPU kernels")
def test_impls_keeps_llmk_and_the_named_peers(tmp_path):
    bench("--op", "rmsnorm", "--tokens", "4", "--hidden", "64", "--impls", "F.rms_norm", "--csv", tmp_path / "r.csv",
          cwd=tmp_path)
    got = rows(tmp_path / "r.csv")
    assert sorted(r["impl"] for r in got) == ["F.rms_norm", "llmk"] and "variant" not in got[0]
