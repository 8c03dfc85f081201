"""Runs the benchmark harness as a user does (``python -m llmk_bench ...`` in a subprocess, the
repository's python/ and bench/ on its path) and reads its CSVs, for the bench tests."""

import csv
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(ROOT / "bench")])}


def bench(*args, cwd, timeout=300) -> str:
    """The harness's stdout for these arguments (a failing run raises)."""
    return subprocess.run([sys.executable, "-m", "llmk_bench", *map(str, args)], check=True, cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=timeout).stdout


def csv_rows(path) -> list:
    """A harness CSV's rows (its '#' header lines skipped)."""
    with open(path) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))
