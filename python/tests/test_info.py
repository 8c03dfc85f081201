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


def test_attention_head_dims():
    """llmk.attention_head_dims against independent lists: what attention and attention_decode
    accept, and the compiled ones a subset of them (CMake's LLMK_HEAD_DIMS)."""
    assert llmk.attention_head_dims(compiled=False) == (32, 64, 96, 128, 256)
    assert llmk.attention_head_dims(compiled=False, decode=True) == (64, 96, 128, 256)
    for decode in (False, True):
        compiled = llmk.attention_head_dims(decode=decode)
        assert set(compiled) <= set(llmk.attention_head_dims(compiled=False, decode=decode))
        assert all(llmk._C.attention_head_dim_compiled(d) for d in compiled)
    assert set(llmk._C.attention_sm90_head_dims()) <= {64, 96, 128, 256} & set(llmk.attention_head_dims())


def test_info_prints_the_head_dims():
    out = subprocess.run([sys.executable, "-m", "llmk", "info"], capture_output=True, text=True, check=True).stdout
    assert "attention head dims: 32, 64, 96, 128, 256; CUDA kernels in this build: " in out
    assert "attention_decode head dims: 64, 96, 128, 256; CUDA kernels in this build: " in out
