# GPU checks (owner: memory and planner areas). Runs on a machine with a CUDA GPU and PyTorch; no
# vLLM, no venv needed. See docs/memory.md and docs/engine.md for what has run on a GPU.
.PHONY: gpu-check
GPU_PYTHON ?= python3
GPU_CHECK_OUT ?= build/gpu-check

gpu-check: ## GPU measurements in one run (<8 min): CUDA KV page release, draft offload/reload, step-time profile
	PYTHONPATH=worker:contract:. NIGHTJAR_GPU_CHECK_OUT=$(GPU_CHECK_OUT) $(GPU_PYTHON) -m benchmarks.gpu_check
	@echo "wrote $(GPU_CHECK_OUT); commit its profiles/*.json under benchmarks/profiles/ and run make bench-planner PROFILE=<one>"
