"""Diagnostic for bench-planner's throughput cells: what each policy does *inside* the measurement
window, over several seeds (the benchmark itself runs seed 1 only).

For each seed and policy: throughput as bench-planner reports it (capped at the offered rate),
delivered rate, mean per-token latency, steps in the window and how many of them speculated.
Not a target; it tells a planner decision apart from trajectory noise (state carried in from the
warm-up, backlog at the window's edges).

    .venv/bin/python -m benchmarks.planner_window --load saturated --seeds 1 2 3 4 5 [--quick]
"""

from __future__ import annotations

import argparse
import sys

from nightjar_worker.sim.profile import CostProfile
from nightjar_worker.sim.simulator import Simulator
from nightjar_worker.sim.workload import make_requests

from benchmarks import bench_planner as bp
from benchmarks.common import print_table, results_dir


class _Recorder:
    """Wraps a policy; records (end time, gamma) per step (the simulator's clock, no idle gaps
    inside a busy run)."""

    name = "recorder"

    def __init__(self, policy, t0: float) -> None:
        self.policy, self.t, self.log = policy, t0, []

    @property
    def arms(self):
        return self.policy.arms

    def decide(self, batch_size: int, prompt_tokens: int = 0) -> int:
        return self.policy.decide(batch_size, prompt_tokens)

    def observe(self, fb) -> None:
        self.t += fb.step_time_s + fb.switch_cost_s
        self.log.append((self.t, fb.gamma))
        self.policy.observe(fb)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load", default="saturated", choices=bp.LOADS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--policies", default="nosd,static-2,static-3,oracle,nightjar")
    ap.add_argument("--quick", action="store_true", help="QUICK request counts")
    args = ap.parse_args(argv)
    path = str(bp.DEFAULT_PROFILE)
    profile = CostProfile.load(path)
    cap = bp.capacity_rps(path, args.quick)
    trace, warm = bp.load_trace(args.load, cap, args.quick)
    specs = bp.policy_specs()
    rows = []
    for seed in args.seeds:
        reqs = make_requests(trace, seed)
        w_hi = reqs[-1].arrival_s
        for name in args.policies.split(","):
            rec = _Recorder(bp.make_policy(specs[name], profile, seed), reqs[0].arrival_s)
            res = Simulator(profile, reqs, seed=seed).run(rec, measure_from_s=warm)
            win = [g for t, g in rec.log if warm < t <= w_hi]
            rows.append([seed, name, res.throughput_tok_s, res.delivered_tok_s,
                         res.mean_token_latency_s * 1e3, len(win), sum(1 for g in win if g > 0)])
    out = results_dir("planner")
    print_table(
        f"Inside the measurement window ({args.load}, {'QUICK' if args.quick else 'full'} sizes, capacity {cap:.1f} req/s)",
        ["seed", "policy", "throughput tok/s", "delivered tok/s", "latency ms", "window steps", "speculative"],
        rows, out / f"window-{args.load}{'-quick' if args.quick else ''}.md",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
