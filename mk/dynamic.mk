# End-to-end evaluation (issue 8): every policy under shifting load on the real worker, and the soak.
.PHONY: bench-dynamic soak

PAIR ?= bundled
SOAK_S ?= 1200
export PAIR

bench-dynamic: install models ## every policy under low->high->low + sawtooth Poisson load on the real worker (QUICK=1, PAIR=bundled|qwen)
	nice -n 5 $(PY) -m benchmarks.bench_dynamic --pair $(PAIR)

soak: install models ## mixed load for SOAK_S s (QUICK=1: 120 s), every response vs plain decoding, RSS slope
	nice -n 5 $(PY) -m benchmarks.soak --pair $(PAIR) $(if $(filter-out 0,$(QUICK)),,--seconds $(SOAK_S))
