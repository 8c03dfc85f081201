#!/usr/bin/env bash
# A same-run A/B of llmk's kernels on the GPU machine: the working tree ("new") against a base
# commit ("base"), each built for the GPU at hand, timed in alternated repeats by the benchmark
# harness (llmk alone unless --impls names peers), with a summary printed last.
#
#   here:        tools/gpu_ab.sh prepare [BASE_REV]      (default HEAD: the uncommitted change)
#   GPU machine: tools/gpu_ab.sh run [--repeats N] BENCH_ARGS...
#                e.g. tools/gpu_ab.sh run --op rmsnorm --tokens 8192 --hidden 4096 16384
#
# `prepare` writes .deps/ab_base.patch (the working tree's difference from BASE_REV; files
# git does not track are not in it: `git add -N` them first), .deps/ab_base_commit and
# .deps/commit (each CSV's header names its variant's tree); carry .deps. The device copy
# has no .git: `run` rebuilds the base as the tree with that patch reversed, in
# /tmp/llmk_ab_base (the Python module only), and the new tree in build-gpu (as
# tools/gpu_check.sh does). Files in $OUT: ab_build.log, ab.csv (every run's rows: the
# benchmark's columns plus variant), ab_runs.log, ab.md (the summary). Tests are gpu_check.sh's job.
# Each variant runs its own op layer (python/llmk: the op table over its own _C) with the
# new tree's harness (bench/llmk_bench, on both variants' PYTHONPATH): an A/B may change a
# schema or add an op, as long as what the harness calls exists on both sides.
# AB_JOBS: parallel build jobs (default 16, the GPU machine's cores).
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  prepare)
    base=${2:-HEAD}
    mkdir -p .deps
    git diff --binary "$base" > .deps/ab_base.patch
    git rev-parse --short "$base" > .deps/ab_base_commit
    git describe --always --dirty --abbrev=7 > .deps/commit
    echo "base $(git rev-parse --short "$base"): .deps/ab_base.patch, $(grep -c '^diff --git' .deps/ab_base.patch) file(s)"
    exit 0 ;;
  run) shift ;;
  *) sed -n '2,/^set /{/^set /!p}' "$0"; exit 2 ;;
esac
repeats=2
if [ "${1:-}" = "--repeats" ]; then repeats=$2; shift 2; fi
[ -f .deps/ab_base.patch ] || { echo "no .deps/ab_base.patch: run 'tools/gpu_ab.sh prepare' here first"; exit 2; }
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
ARCHS=${LLMK_CUDA_ARCHS:-90a}
BASE=/tmp/llmk_ab_base
export PYTHONUNBUFFERED=1
[ -f .deps/commit ] && export LLMK_COMMIT=${LLMK_COMMIT:-$(cat .deps/commit)}
source tools/gpu_peers.sh
peers=$(peers_path)  # peers carried as wheels, ':'-prefixed for PYTHONPATH
peers=${peers:+:$peers}

# The tests' GoogleTest as gpu_check.sh finds it (configured, not built), else no tests.
tests=(-DLLMK_BUILD_TESTS=OFF)
[ -d .deps/googletest ] && tests=(-DLLMK_GTEST_SOURCE=$PWD/.deps/googletest)
build() {  # build(source dir, build dir): the Python module (and the library under it)
  cmake -S "$1" -B "$2" -G Ninja -DLLMK_CUDA_ARCHS="$ARCHS" -DLLMK_BUILD_PYTHON=ON -DLLMK_LINEINFO=ON "${tests[@]}" \
    -DPython_EXECUTABLE="$(command -v python3)" >> "$OUT/ab_build.log" 2>&1 &&
    cmake --build "$2" -j "${AB_JOBS:-16}" --target _C >> "$OUT/ab_build.log" 2>&1
}
t0=$(date +%s)
rm -rf "$BASE" && mkdir -p "$BASE"
tar --exclude=./build-gpu --exclude=./.deps --exclude=./.git -cf - . | tar -xf - -C "$BASE"
if ! (cd "$BASE" && git apply -R "$OLDPWD/.deps/ab_base.patch" 2>> "$OUT/ab_build.log" ||
      patch -s -R -p1 < "$OLDPWD/.deps/ab_base.patch" >> "$OUT/ab_build.log" 2>&1); then
  echo "the base patch does not reverse onto this tree (see ab_build.log)"; exit 1
fi
build "$BASE" "$BASE/build" || { echo "BASE BUILD FAILED"; tail -30 "$OUT/ab_build.log"; exit 1; }
build . build-gpu || { echo "NEW BUILD FAILED"; tail -30 "$OUT/ab_build.log"; exit 1; }
echo "== builds: $(( $(date +%s) - t0 )) s"
rm -rf "$BASE/harness" && cp -r "$BASE/python" "$BASE/harness" && compgen -G "$BASE/harness/llmk/_C*.so" > /dev/null ||
  { echo "no base _C to time"; exit 1; }

# Each run's rows go to ab.csv (one header, the variant column tells them apart) and its
# output to ab_runs.log: the device returns at most 8 files from $OUT.
: > "$OUT/ab_runs.log"
for r in $(seq "$repeats"); do
  for variant in base new; do
    path=$PWD/python commit=${LLMK_COMMIT:-}
    [ $variant = base ] && path=$BASE/harness commit=$(cat .deps/ab_base_commit 2>/dev/null)
    echo "==== $variant repeat $r" >> "$OUT/ab_runs.log"
    LLMK_COMMIT=$commit PYTHONPATH=$path:$PWD/bench${peers:-} python3 -m llmk_bench --impls --variant $variant "$@" \
      --csv "$OUT/ab_run.csv" >> "$OUT/ab_runs.log" 2>&1 ||
      echo "== $variant repeat $r: rc=$? (see ab_runs.log)"
    [ -f "$OUT/ab_run.csv" ] || continue
    if [ -f "$OUT/ab.csv" ]; then grep -v -e '^#' -e '^op,' "$OUT/ab_run.csv" >> "$OUT/ab.csv"
    else { echo "# A/B: base = $(cat .deps/ab_base_commit 2>/dev/null), new = ${LLMK_COMMIT:-}"
           cat "$OUT/ab_run.csv"; } > "$OUT/ab.csv"; fi
    rm -f "$OUT/ab_run.csv"
  done
done
echo "== timed: $(( $(date +%s) - t0 )) s"
[ -f "$OUT/ab.csv" ] || { echo "no run wrote a CSV (see ab_runs.log)"; exit 1; }
PYTHONPATH=$PWD/bench python3 -m llmk_bench --ab-summary "$OUT/ab.csv" | tee "$OUT/ab.md"
