# Elastic draft memory (owner: memory). Its engine test needs the bundled pair (TEST_DEPS += models in mk/models.mk).
.PHONY: bench-offload test-memory

bench-offload: install models ## elastic memory at saturation: resident vs offloaded, reload under load (QUICK=1 short)
	$(PY) -m benchmarks.bench_offload

test-memory: install ## memory-area tests (engine test included when the models exist)
	$(VENV)/bin/pytest -q tests/memory
