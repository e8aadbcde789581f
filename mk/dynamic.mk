# End-to-end evaluation (issue 8): every policy under shifting load on the real worker, and the soak.
.PHONY: bench-dynamic soak

PAIR ?= bundled
# extra bench_dynamic flags, e.g. DYNAMIC_ARGS="--kv-base-blocks 24" (memory-tight; docs/serving.md)
DYNAMIC_ARGS ?=
# 40 min: at the soak's load oneDNN's primitive cache fills for ~30 min before RSS levels off (docs/serving.md)
SOAK_S ?= 2400
export PAIR

bench-dynamic: install models ## every policy under low->high->low + sawtooth Poisson load on the real worker (QUICK=1, PAIR=bundled|qwen)
	nice -n 5 $(PY) -m benchmarks.bench_dynamic --pair $(PAIR) $(DYNAMIC_ARGS)

soak: install models ## mixed load for SOAK_S s (QUICK=1: 120 s), every response vs plain decoding, RSS slope
	nice -n 5 $(PY) -m benchmarks.soak --pair $(PAIR) $(if $(filter-out 0,$(QUICK)),,--seconds $(SOAK_S))
