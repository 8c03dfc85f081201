# make bench: build, then run the benchmark table (on a machine without a GPU: the CPU
#             backend on small shapes, and it says so).
# make test:  build, then run the C++ tests (ctest) and the Python tests (pytest).
# Python packages come from the system Python when it has them (torch, nanobind, pytest),
# else from a local .venv made from requirements-dev.txt.

BUILD ?= build
LLMK_CUDA_ARCHS ?= 80;90a
# LLMK_HEAD_DIMS (unset: every head dim of src/common/head_dims.h) trims the attention kernels.
PYTHON ?= python3
VENV := .venv
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
GTEST_SOURCE ?= $(wildcard $(CURDIR)/.deps/googletest)
BENCH_ARGS ?= --all --csv $(BUILD)/bench.csv --table $(BUILD)/bench.md --plot $(BUILD)/bench.png

PY := $(shell $(PYTHON) -c "import torch, nanobind, pytest" >/dev/null 2>&1 && command -v $(PYTHON) || echo $(CURDIR)/$(VENV)/bin/python)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: all deps build test bench clean
all: build

deps:
	@if [ "$(PY)" = "$(CURDIR)/$(VENV)/bin/python" ] && [ ! -f $(VENV)/.installed ]; then \
	  echo "installing Python packages into $(VENV)"; \
	  $(PYTHON) -m venv $(VENV) && $(VENV)/bin/python -m pip install -q -r requirements-dev.txt && \
	  touch $(VENV)/.installed; \
	fi

# One configuration serves both commands (the C++ tests included), so `make bench` then
# `make test` builds once.
build: deps
	cmake -S . -B $(BUILD) $(GENERATOR) -DLLMK_CUDA_ARCHS="$(LLMK_CUDA_ARCHS)" \
	  $(if $(LLMK_HEAD_DIMS),-DLLMK_HEAD_DIMS="$(LLMK_HEAD_DIMS)") \
	  -DLLMK_BUILD_PYTHON=ON -DLLMK_BUILD_TESTS=ON -DPython_EXECUTABLE=$(PY) \
	  $(if $(GTEST_SOURCE),-DLLMK_GTEST_SOURCE=$(GTEST_SOURCE))
	@start=$$(date +%s); cmake --build $(BUILD) -j $(JOBS) && \
	  echo "build: $$(( $$(date +%s) - start )) s on $(JOBS) jobs (archs $(LLMK_CUDA_ARCHS))"

test: build
	@PYTHONPATH=$(CURDIR)/python $(PY) -c "from llmk import _C; i = _C.device_info(0); \
	  print('GPU tests: run on ' + i['name'] if i['available'] else 'GPU tests: skipped (' + i['error'] + ')')"
	ctest --test-dir $(BUILD) --output-on-failure
	LLMK_BUILD_DIR=$(CURDIR)/$(BUILD) PYTHONPATH=$(CURDIR)/python $(PY) -m pytest python/tests -q -rs

bench: build
	PYTHONPATH=$(CURDIR)/python:$(CURDIR)/bench $(PY) -m llmk_bench $(BENCH_ARGS)

clean:
	rm -rf $(BUILD) python/llmk/_C*.so
