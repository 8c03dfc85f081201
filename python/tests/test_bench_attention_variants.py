"""The benchmark harness's attention_variants suite (bench/llmk_bench/suites/attention_variants.py)
on the CPU backend at its small shapes: a row per impl and case, llmk's error at the reference's
(the variant's float64 definition), and the window's plain-causal yardstick. The GPU run is the
device's."""

import pytest

import llmk  # noqa: F401  (registers torch.ops.llmk)
from bench_cli import bench, csv_rows
from conftest import HAS_CUDA


@pytest.mark.skipif(HAS_CUDA, reason="the CPU backend's run; on a GPU the suite times the GPU kernels")
def test_variants_suite_on_the_cpu(tmp_path):
    ops = [f"attention_{v}{t}" for v in ("window", "softcap", "sinks") for t in ("", "_train")]
    bench(*[a for op in ops for a in ("--op", op)], "--tokens", 64, "--csv", tmp_path / "v.csv", cwd=tmp_path)
    rows = csv_rows(tmp_path / "v.csv")
    impls = {(r["op"], r["impl"]): r for r in rows}
    assert set(impls) == {(op, "llmk") for op in ops} | {(op, "llmk_causal") for op in ops if "window" in op}
    for (op, impl), r in impls.items():
        assert r["tokens"] == "64" and r["hidden"] == "64" and float(r["time_us"]) > 0
        if impl == "llmk":
            assert float(r["max_rel_err"]) < 1e-2, (op, r["max_rel_err"])
    # The window (16 keys of 64) differs from plain causal: the yardstick's error shows it (out, and
    # the training step's dq).
    for op in ("attention_window", "attention_window_train"):
        assert float(impls[(op, "llmk_causal")]["max_rel_err"]) > 1e-2, op
