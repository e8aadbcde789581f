"""``nightjar-sim``: run one policy through the step-level simulator and print its metrics (JSON).

Examples::

    nightjar-sim --policy nightjar --rate 20 --duration 60
    nightjar-sim --profile benchmarks/profiles/cpu-pair.json --policy static --static-gamma 2 --dynamic
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nightjar_contract.planner import DEFAULT_MAX_GAMMA
from pydantic import ValidationError

from nightjar_worker.planner import PlannerConfig, build_policy
from nightjar_worker.planner.oracle import OraclePolicy
from nightjar_worker.sim.profile import CostProfile
from nightjar_worker.sim.simulator import Simulator
from nightjar_worker.sim.workload import Workload, dynamic_trace, make_requests

DEFAULT_PROFILE = Path("benchmarks/profiles/roofline-h100-7b.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nightjar-sim", description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, default=DEFAULT_PROFILE, help="cost profile JSON")
    ap.add_argument("--policy", default="nightjar", help="nightjar|nosd|static|table|dsd|ucb|oracle")
    ap.add_argument("--static-gamma", type=int, default=None)
    ap.add_argument("--max-gamma", type=int, default=DEFAULT_MAX_GAMMA)
    ap.add_argument("--rate", type=float, default=10.0, help="requests per second (Poisson)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    ap.add_argument("--dynamic", action="store_true", help="low -> --rate -> low trace (phases of --duration)")
    ap.add_argument("--warmup", type=float, default=0.0, help="seconds simulated but not measured")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--paper-mode", action="store_true", help="Nightjar without its extensions")
    args = ap.parse_args(argv)

    if not args.profile.exists():
        ap.error(f"--profile: {args.profile} does not exist")
    profile = CostProfile.load(args.profile)
    try:
        cfg = PlannerConfig(policy=args.policy, max_gamma=args.max_gamma, static_gamma=args.static_gamma,
                            max_batch=profile.max_batch, seed=args.seed, paper_mode=args.paper_mode)
    except ValidationError as e:
        ap.error(f"invalid planner configuration: {e}")
    if cfg.policy == "oracle":
        policy = OraclePolicy(cfg, profile, Workload().category_weights())
    else:
        policy = build_policy(cfg, profile)
    trace = (dynamic_trace(args.rate / 10, args.rate, args.duration) if args.dynamic
             else [(args.duration, args.rate)])
    reqs = make_requests(trace, args.seed)
    res = Simulator(profile, reqs, seed=args.seed).run(policy, measure_from_s=args.warmup)
    out = {
        "policy": args.policy, "profile": profile.name, "requests": res.completed,
        "throughput_tok_s": res.throughput_tok_s, "delivered_tok_s": res.delivered_tok_s,
        "mean_token_latency_s": res.mean_token_latency_s, "mean_tpot_s": res.mean_tpot_s,
        "steps": res.steps, "switches_on": res.switches_on, "switch_time_s": res.switch_time_s,
        "preemptions": res.preemptions, "max_blocks_used": res.max_blocks_used,
        "kv_budget_blocks": res.kv_budget_blocks, "gamma_steps": res.gamma_steps,
    }
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
