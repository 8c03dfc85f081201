"""``llmk info``: what GPU llmk sees and which code paths it will use there."""

import argparse
import os
import sys

from . import _C, attention_head_dims

# From the C++ library's one list: what attention accepts (the CPU backend computes all of them),
# and the head dims its Hopper (sm_90a) forward and backward take in fp16/bf16, as compiled.
ATTENTION_HEAD_DIMS = attention_head_dims(compiled=False)
ATTENTION_SM90_HEAD_DIMS = tuple(_C.attention_sm90_head_dims())


def _runs_on(arch: str, major: int, minor: int) -> bool:
    """Machine code for `arch` runs on sm_<major><minor>: same major and a minor at least
    the code's; arch-specific code ("90a") only on exactly that arch."""
    built_major, built_minor = divmod(int(arch.rstrip("a")), 10)
    if arch.endswith("a"):
        return (built_major, built_minor) == (major, minor)
    return built_major == major and built_minor <= minor


def _info() -> int:
    archs = _C.build_cuda_archs()
    print(f"llmk build: machine code for CUDA archs {archs}")
    print(_head_dims_line("attention", decode=False))
    print(_head_dims_line("attention_decode", decode=True))
    count = _C.cuda_device_count()
    if count == 0:
        print("no CUDA GPU found: every op runs on the CPU reference backend (host tensors)")
        return 0
    for index in range(count):
        i = _C.device_info(index)
        major, minor = i["compute_capability"]
        print(f"cuda:{index}  {i['name']}  sm_{major}{minor}  {i['sm_count']} SMs")
        print(f"  memory bus {i['memory_bus_bits']} bit at {i['memory_clock_khz'] / 1e3:.0f} MHz:"
              f" peak {i['peak_bandwidth_gbs']:.0f} GB/s (datasheet; measured copy is lower)")
        print(f"  L2 {i['l2_bytes'] / 2**20:.0f} MiB, shared memory {i['shared_mem_per_block_optin'] // 1024} KiB"
              f" per block (opt-in), {i['max_threads_per_sm']} threads per SM")
        print(f"  tensor cores: ~{i['peak_bf16_tflops']:.0f} TFLOP/s bf16 dense (estimate at"
              f" {i['sm_clock_khz'] / 1e3:.0f} MHz)")
        ptx = _C.build_ptx_arch()
        if not any(_runs_on(a, major, minor) for a in archs.split(";")):
            if ptx and int(ptx) <= major * 10 + minor:
                print(f"  no machine code for sm_{major}{minor} in this build: the driver JIT-compiles its"
                      f" compute_{ptx} PTX at first use, so every family takes its sm_{ptx} path here"
                      " (mma.sync attention, decode and GEMM; no Hopper kernels); rebuild with"
                      f" LLMK_CUDA_ARCHS including {major}{minor} for machine code")
            else:
                print("  WARNING: this build has no machine code this GPU can run; rebuild with"
                      f" LLMK_CUDA_ARCHS including {major}{minor}")
        print("  code paths: rmsnorm/add_rmsnorm/rmsnorm_backward: row-in-registers kernels with"
              " 16-byte accesses for aligned rows (d up to 32768 forward),"
              " a scalar loop kernel otherwise")
        hopper = (major, minor) == (9, 0) and "90a" in archs.split(";")
        print("  gemm/linear: " + ("Hopper TMA + wgmma kernel for M >= 33 (16-byte rows, out dtype = input dtype;"
                                   " clusters of 2 blocks sharing B, 1 for M <= 128; split-K when its tiles would not"
                                   " fill the GPU: at M <= 128 a tile's 2-8 pieces in a cluster, reduced there, and"
                                   " a last partial wave split off as a call of its own),"
                                   " small-M weight-streaming kernel for M <= 32,"
                                   if hopper else "no Hopper kernel here (needs sm_90 and an sm_90a build),"
                                   " small-M weight-streaming kernel for M <= 64,")
              + " mma.sync kernel for the rest"
              " (LLMK_GEMM_PATH=sm90|small_m|sm80 forces one)")
        print("  rmsnorm_linear: the small-M kernel, normalizing x as it is staged"
              + (" (M <= 32); rmsnorm into scratch memory + the Hopper kernel for M >= 33" if hopper else ""))
        print("  quantized_linear: "
              + ("int4 at M = 17-128: Hopper wgmma kernel (the weight dequantized into wgmma's register"
                 " operand from a TMA ring, split-K reduced in a cluster); " if hopper else "")
              + "int4/int8 weights streamed and dequantized in registers for M <= 128"
              " (int4 at M <= 16: the group scale applied to each group's fp32 sum),"
              " dequantize into a workspace + gemm above (LLMK_QUANTIZED_PATH=stream|dequant|sm90 forces one)")
        print("  attention: " + _attention_paths(hopper, ATTENTION_SM90_HEAD_DIMS))
        print("  attention backward: " + _attention_paths(hopper, ATTENTION_SM90_HEAD_DIMS))
        print("  attention score variants (window, softcap, sinks): "
              + ("the Hopper forward (2-consumer tiles), the Hopper backward and attention_decode;" if hopper
                 else "attention_decode;")
              + " the CPU backend; the sm_80 forward and backward reject them")
        print("  attention_decode: mma.sync split-KV kernel; "
              + ("2-8 pieces merged inside a thread-block cluster, more by a merge kernel over the workspace"
                 if major >= 9 and any(a.rstrip("a").isdigit() and int(a.rstrip("a")) >= 90 for a in archs.split(";"))
                 else "pieces merged by a merge kernel over the workspace")
              + " (LLMK_DECODE_MERGE=kernel|cluster forces one)"
              + ("; from 64 query tokens without append (16-bit cache, head dims 64-128, pages a multiple of 8)"
                 " the Hopper forward over the cache (LLMK_DECODE_PATH=decode|prefill forces one)" if hopper else ""))
    return 0


def _head_dims_line(op: str, decode: bool) -> str:
    """The head dims `op` accepts (the CPU backend computes all of them) and those this build has
    CUDA kernels for (LLMK_HEAD_DIMS trims them)."""
    supported, compiled = attention_head_dims(compiled=False, decode=decode), attention_head_dims(decode=decode)
    line = f"{op} head dims: {_join(supported)}; CUDA kernels in this build: {_join(compiled) or 'none'}"
    return line + (" (LLMK_HEAD_DIMS)" if compiled != supported else "")


def _attention_paths(hopper: bool, sm90_dims) -> str:
    """Which attention kernel (forward, or the backward's main kernel) takes which calls on a
    device (`hopper`: sm_90 and an sm_90a build; `sm90_dims`: the head dims its Hopper kernel
    takes), as far as this build's LLMK_HEAD_DIMS compiled the head dims."""
    dims = attention_head_dims()
    wgmma = [d for d in dims if hopper and d in sm90_dims]
    mma = [d for d in dims if d not in wgmma]
    if wgmma:
        line = (f"Hopper TMA + wgmma kernel for fp16/bf16 head dims {_join(wgmma)}, mma.sync (sm_80) kernel for "
                + (f"head dims {_join(mma)} and " if mma else "") + "calls the Hopper kernel does not take")
    else:
        line = (f"mma.sync (sm_80) kernel for head dims {_join(dims)}"
                + ("" if hopper else " (no Hopper kernel here: needs sm_90 and an sm_90a build)"))
    missing = [d for d in ATTENTION_HEAD_DIMS if d not in dims]
    if missing:
        line += f"; no kernel for head dims {_join(missing)} in this build (LLMK_HEAD_DIMS)"
    forced = os.environ.get("LLMK_ATTENTION_PATH", "auto")
    return line + " (LLMK_ATTENTION_PATH=sm90|sm80 forces one" + (f"; set to {forced} here)" if forced != "auto"
                                                                     else ")")


def _join(values) -> str:
    return ", ".join(str(v) for v in values)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="llmk", description="llmk command line")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="print the detected GPU's facts and llmk's code paths")
    args = parser.parse_args(argv)
    if args.command == "info":
        return _info()
    return 1


if __name__ == "__main__":
    sys.exit(main())
