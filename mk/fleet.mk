# Fleet loop (owner: fleet area). See docs/fleet.md.
.PHONY: bench-warmstart

bench-warmstart: install ## cold vs fleet-warm-started planner in the simulator (QUICK=1: ~15 s)
	$(PY) -m benchmarks.bench_warmstart
