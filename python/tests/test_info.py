"""`llmk info` runs and says what it found."""

import subprocess
import sys

import llmk


def test_info_cli():
    out = subprocess.run([sys.executable, "-m", "llmk", "info"], capture_output=True, text=True, check=True).stdout
    assert "llmk build: machine code for CUDA archs" in out
    if llmk._C.cuda_device_count() == 0:
        assert "no CUDA GPU found" in out
    else:
        assert "SMs" in out and "GB/s" in out


def test_device_info_dict():
    info = llmk.device_info(0)
    assert set(info) >= {"available", "name", "sm_count", "peak_bandwidth_gbs"}
    assert info["available"] == (llmk._C.cuda_device_count() > 0)
