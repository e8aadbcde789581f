# GPU checks (owner: memory and planner areas). Runs on a machine with a CUDA GPU and PyTorch; no
# vLLM, no venv needed. See docs/memory.md and docs/engine.md for what has run on a GPU.
.PHONY: gpu-check
GPU_PYTHON ?= python3
GPU_CHECK_OUT ?= build/gpu-check

gpu-check: ## GPU measurements in one run (<8 min): CUDA KV page release, draft offload/reload, step-time profile
	PYTHONPATH=worker:contract:. NIGHTJAR_GPU_CHECK_OUT=$(GPU_CHECK_OUT) $(GPU_PYTHON) -m benchmarks.gpu_check
	@# the gpu-marked tests assert the same checks' criteria (pytest may be missing on a bare GPU machine)
	@if $(GPU_PYTHON) -c "import pytest" 2>/dev/null; then \
	  PYTHONPATH=worker:contract:. $(GPU_PYTHON) -m pytest -q -p no:cacheprovider -m gpu tests/gpu \
	    | tee $(GPU_CHECK_OUT)/gpu-tests.txt; \
	else echo "pytest is not installed: tests/gpu did not run (the RESULT line's *_passed say the same)"; fi
	@echo "wrote $(GPU_CHECK_OUT); commit its profiles/*.json under benchmarks/profiles/ and run make bench-planner PROFILE=<one>"
