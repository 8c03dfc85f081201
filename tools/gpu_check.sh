#!/usr/bin/env bash
# One run on the GPU machine: build for the GPU at hand (sm_90a on the H100) with ninja,
# run every GPU test, compute-sanitizer memcheck on a short subset, the named benchmarks,
# and a summary printed last. Logs and CSVs go to $OUT (default ./gpu_out).
#
#   tools/gpu_check.sh [--no-tests] [--no-bench] [bench ops ...]   (default ops: all)
#   CTEST_ONLY=1: the tests without pytest (a run that must fit a time limit).
#   Files in $OUT: build.log (with ptxas resource usage), ctest.log, pytest.log,
#   sanitizer.log, bench.log, bench.csv, bench.md, bench.png.
#
# GoogleTest: the installed one, else the source tree in .deps/googletest (carry it to a
# machine that has none: cp -r /usr/src/googletest .deps/).
# Benchmark peers that the GPU machine lacks (Liger-Kernel) come as wheels in .deps/whl,
# installed for this run only (tools/gpu_peers.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
ARCHS=${LLMK_CUDA_ARCHS:-90a}
BUILD=build-gpu
run_tests=1 run_bench=1 ops=()
for a in "$@"; do
  case "$a" in
    --no-tests) run_tests=0 ;;
    --no-bench) run_bench=0 ;;
    *) ops+=(--op "$a") ;;
  esac
done
[ ${#ops[@]} -eq 0 ] && ops=(--all)
summary=()
note() { summary+=("$1"); echo "== $1"; }
export PYTHONPATH=$PWD/python:$PWD/bench PYTHONUNBUFFERED=1
# The commit the benchmark CSV names: the device copy has no .git, so it comes from here.
[ -f .deps/commit ] && export LLMK_COMMIT=${LLMK_COMMIT:-$(cat .deps/commit)}
source tools/gpu_peers.sh
peers=$(peers_path)
[ -n "$peers" ] && export PYTHONPATH=$PYTHONPATH:$peers

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv; nvcc --version | tail -2;
  python3 -c "import torch; print('torch', torch.__version__)"; } > "$OUT/build.log" 2>&1
t0=$(date +%s)
gtest=()
[ -d .deps/googletest ] && gtest=(-DLLMK_GTEST_SOURCE=$PWD/.deps/googletest)
if cmake -S . -B $BUILD -G Ninja -DLLMK_CUDA_ARCHS="$ARCHS" -DLLMK_BUILD_PYTHON=ON -DLLMK_PTXAS_VERBOSE=ON -DLLMK_LINEINFO=ON \
     -DPython_EXECUTABLE="$(command -v python3)" "${gtest[@]}" >> "$OUT/build.log" 2>&1 &&
   cmake --build $BUILD -j 16 >> "$OUT/build.log" 2>&1; then
  note "build ok ($(( $(date +%s) - t0 )) s, archs $ARCHS)"
else
  note "BUILD FAILED (see build.log)"; tail -40 "$OUT/build.log"; exit 1
fi
spills=$(grep -cE "[1-9][0-9]* bytes spill (stores|loads)" "$OUT/build.log")
note "ptxas: $spills kernel(s) with spills"

if [ $run_tests -eq 1 ]; then
  [ -n "${CTEST_ONLY:-}" ] && run_pytest=0 || run_pytest=1
  ctest --test-dir $BUILD --output-on-failure -j 4 > "$OUT/ctest.log" 2>&1
  note "ctest: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log")"
  if [ $run_pytest -eq 1 ]; then
    python3 -m pytest python/tests -q -p no:cacheprovider > "$OUT/pytest.log" 2>&1
    note "pytest: $(tail -1 "$OUT/pytest.log")"
  fi
  : > "$OUT/sanitizer.log"
  tests=$BUILD/tests/cpp/llmk_tests  # every C++ test; the filters pick a short subset
  for f in "RMSNormGpu.StridedRows*" "AddRMSNormGpu.Strided*" "RMSNormBackwardGpu.ManyRows*" \
           "LayerNormGpu.Optional*" "LayerNormBackwardGpu.ManyRows*" "GatedActivationGpu.TwoTensor*" \
           "SoftmaxGpu.Scales*" "RopeGpu.*" "AdamWGpu.*" "RMSNormSwigluGpu.*" "BiasGeluGpu.*" \
           "AttentionGpu.GqaMqa*" "AttentionVarlen.*" "GemmGpu.Epilogues*" "GemmGpu.BatchedAndZeroK*" \
           "GemmGpu.SplitKFewTiles*" "RmsnormLinearGpu*" "AttentionDecodeGpu.AppendAndRotary*" \
           "AttentionDecodeGpu.Fp8Cache*" "AttentionDecodeGpu.PageSizes*" "AttentionBackwardGpu.FullyMaskedRows*" \
           "AttentionBackwardVarlen.*" "SoftmaxGpu.VocabularyRows*" "BiasGeluGpu.Repeated*" "RopeGpu.OutOfPlace*" \
           "RMSNormGpu.ManyLongRows*" "AddRMSNormGpu.ManyLongRows*" "QuantizedGemm.GpuMatchesCpu"; do
    compute-sanitizer --tool memcheck --error-exitcode 3 $tests --gtest_filter="$f" >> "$OUT/sanitizer.log" 2>&1
    rc=$?
    note "memcheck $f: $([ $rc -eq 0 ] && echo clean || echo "FAILED rc=$rc")"
  done
  # Paths only the Python tests reach: the prefill over a paged KV cache, the backward score
  # variants. pytest's rc 5 (no test selected) counts as a failure.
  for sel in "test_attention_decode_prefill.py|test_matches_reference and 128 and 16 or test_contiguous_capacity_edges" \
             "test_attention_variants.py|test_cuda_backward"; do
    compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -q -p no:cacheprovider \
      "python/tests/${sel%%|*}" -k "${sel#*|}" >> "$OUT/sanitizer.log" 2>&1
    rc=$?
    note "memcheck ${sel%%|*} -k '${sel#*|}': $([ $rc -eq 0 ] && echo clean || echo "FAILED rc=$rc")"
  done
  cmake --install $BUILD --prefix $BUILD/install > /dev/null &&
    cmake -S examples/cpp -B $BUILD/example -G Ninja -DCMAKE_PREFIX_PATH=$PWD/$BUILD/install > /dev/null &&
    cmake --build $BUILD/example > /dev/null
  note "installed-package example: $($BUILD/example/rmsnorm_example 2>&1)"
  for f in "RMSNormBackwardGpu.ManyRows*" "SoftmaxGpu.Scales*" "RMSNormSwigluGpu.*" "AttentionVarlen.*" \
           "GemmGpu.Epilogues*" "SoftmaxGpu.VocabularyRows*" "BiasGeluGpu.Repeated*"; do
    compute-sanitizer --tool racecheck --error-exitcode 3 $tests --gtest_filter="$f" >> "$OUT/sanitizer.log" 2>&1
    rc=$?
    note "racecheck $f: $([ $rc -eq 0 ] && echo clean || echo "FAILED rc=$rc")"
  done
fi

if [ $run_bench -eq 1 ]; then
  # BENCH_ARGS narrows the sweep, e.g. BENCH_ARGS="--tokens 1 8192 --hidden 4096"
  python3 -m llmk_bench "${ops[@]}" ${BENCH_ARGS:-} --csv "$OUT/bench.csv" --table "$OUT/bench.md" --plot "$OUT/bench.png" \
    > "$OUT/bench.log" 2>&1
  note "bench: rc=$? ($(grep -c . "$OUT/bench.csv" 2>/dev/null || echo 0) csv lines)"
  tail -60 "$OUT/bench.log"
fi

echo "================ summary"
printf '%s\n' "${summary[@]}"
