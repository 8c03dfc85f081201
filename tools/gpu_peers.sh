# Sourced by tools/gpu_check.sh and tools/gpu_ab.sh (from the repository root).
# peers_path: installs the benchmark peers that the GPU machine lacks and that come as wheels
# in .deps/whl (Liger-Kernel: pure Python over Triton) into /tmp/llmk_peers, for this run
# only, and prints that directory for PYTHONPATH; prints nothing when no wheel is carried or
# the install fails. Carry one with:
#   pip download --no-deps --only-binary=:all: -d .deps/whl liger-kernel==0.8.5
peers_path() {
  compgen -G ".deps/whl/*.whl" > /dev/null || return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/llmk_peers \
    .deps/whl/*.whl >&2 && echo /tmp/llmk_peers
}
