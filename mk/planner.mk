# Planner, baselines and simulator (owner: planner area). See docs/planner.md.
.PHONY: bench-planner roofline-profile

bench-planner: install ## planner vs baselines in the simulator (QUICK=1: 15-45 min on 2 shared cores; PROFILE=<json> to pick a profile)
	QUICK=$(QUICK) PROFILE=$(PROFILE) $(PY) -m benchmarks.bench_planner

roofline-profile: install ## regenerate benchmarks/profiles/roofline-h100-7b.json (analytic)
	$(PY) -m nightjar_worker.sim.roofline benchmarks/profiles/roofline-h100-7b.json
