# Serving area: the worker's API server, the demo and the serving benchmark (see docs/serving.md).
.PHONY: serve demo bench-serve bench-sources bench-ngram bench-cpu-gemm readme-results publish-results

PORT ?= 8000

serve: install models ## run the worker (Nightjar scheduler, bundled pair) on $(PORT)
	$(VENV)/bin/nightjar-worker serve --port $(PORT)

demo: install models ## gamma 0 vs Nightjar on the same prompts, a load spike, the prompts again (PAIR=qwen: the Qwen pair); plot under build/results/demo
	$(PY) -m nightjar_worker.demo

bench-serve: install models ## every policy under closed-loop load on the real server (QUICK=1: c=1 and saturation)
	$(PY) -m benchmarks.bench_serve

bench-sources: install models ## the speculation sources (draft, n-gram, suffix) and Nightjar over them: repeated tasks vs fresh prompts, interleaved blocks with spreads, draft resident and offloaded
	$(PY) -m benchmarks.bench_sources

bench-ngram: bench-sources ## alias of bench-sources (its former name)

bench-cpu-gemm: install ## bf16 vs fp32 GEMM cost per row count on this CPU (why the Qwen pair serves in float32)
	$(PY) -m benchmarks.bench_cpu_gemm

readme-results: ## regenerate docs/results.md's real-engine result tables from benchmarks/results/
	$(PY) -m benchmarks.readme_results

publish-results: ## keep a run in the tree: NAME=<folder under build/results> (table, figure, summary), then readme-results
	$(PY) -m benchmarks.publish $(NAME)
