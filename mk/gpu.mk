# GPU checks (owner: memory and planner areas). Runs on a machine with a CUDA GPU and PyTorch; no
# vLLM, no venv needed. See docs/memory.md and docs/engine.md for what has run on a GPU.
.PHONY: gpu-check
GPU_PYTHON ?= python3
GPU_CHECK_OUT ?= build/gpu-check

# Exits non-zero when any criterion fails (the RESULT line then says passed=false) or the gpu-marked
# tests fail; no pipe hides an exit status. GPU_CHECK_FAIL=<criterion> forces a failure (the tests
# show the exit status that way); GPU_CHECK_DRY=1 runs it on CPU.
gpu-check: ## GPU measurements in one run (<8 min, exits non-zero on a failed criterion): KV page release, draft offload/reload, step-time profile
	@set -o pipefail; start=$$(date +%s); rc=0; mkdir -p $(GPU_CHECK_OUT); \
	PYTHONPATH=worker:contract:. NIGHTJAR_GPU_CHECK_OUT=$(GPU_CHECK_OUT) $(GPU_PYTHON) -m benchmarks.gpu_check || rc=$$?; \
	if $(GPU_PYTHON) -c "import pytest" 2>/dev/null; then \
	  PYTHONPATH=worker:contract:. $(GPU_PYTHON) -m pytest -q -p no:cacheprovider -m gpu tests/gpu \
	    --junitxml=$(GPU_CHECK_OUT)/gpu-tests.xml || rc=$$?; \
	else echo "pytest is not installed: tests/gpu did not run (the RESULT line's criteria say the same)"; fi; \
	wall=$$(( $$(date +%s) - start )); \
	if [ $$wall -gt 480 ]; then echo "gpu-check: took $${wall}s, over the 8 minutes it must fit"; [ $$rc -ne 0 ] || rc=1; fi; \
	echo "gpu-check: wall $${wall}s, exit $$rc; wrote $(GPU_CHECK_OUT) (commit its profiles/*.json under benchmarks/profiles/ and run make bench-planner PROFILE=<one>)"; \
	exit $$rc
