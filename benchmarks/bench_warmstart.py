"""Warm start from fleet priors: does a new worker learn faster with what the fleet already knows?

Setup (all in the step-level simulator, on one cost profile):

1. *Fleet*: ``--fleet`` workers, each serving its own request trace (different seeds) with a cold
   Nightjar planner. Their planner snapshots are exported exactly as a worker exports them
   (``nightjar_planner_loss_seconds`` / ``nightjar_planner_count`` in Prometheus text, names from
   ``nightjar_worker.metrics``), parsed and aggregated by the operator's fleet code
   (``promtext`` -> ``aggregate`` -> ``priors.merge_priors``, bounded pseudo-counts).
2. *New worker*: a held-out trace (same trace for both runs) served by a cold planner and by one
   warm-started with ``set_priors(fleet priors)``; same seed, same requests.

Regret of a step is the pseudo-regret ``L(b, gamma) - min_g L(b, g)`` with ``L`` the expected seconds per
generated token at the step's batch ``b`` under the workload's acceptance mix (the oracle baseline's
cost model; noise-free, C_switch excluded); summed over
the first ``--steps`` decoding steps, averaged over ``--seeds`` held-out traces.

Last line: ``RESULT regret_reduction=<1 - warm regret / cold regret> ...`` (target >= 0.30).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from nightjar_operator.fleet.aggregate import aggregate, extract
from nightjar_operator.fleet.priors import PriorsConfig, merge_priors
from nightjar_operator.fleet.promtext import parse
from nightjar_worker.planner import PlannerConfig, PlannerPriors, build_policy
from nightjar_worker.planner.oracle import OraclePolicy
from nightjar_worker.sim.profile import CostProfile
from nightjar_worker.sim.simulator import Simulator
from nightjar_worker.sim.workload import Workload, dynamic_trace, make_requests

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
DEFAULT_PROFILE = ROOT / "profiles" / "roofline-h100-7b.json"


def exposition(snapshot: PlannerPriors) -> str:
    """A worker's planner gauges as its ``/metrics`` would show them (names from the worker module)."""
    from nightjar_worker import metrics as wm
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    reg = CollectorRegistry()
    loss = Gauge(wm.planner_loss_seconds._name, "loss", ["bucket", "gamma"], registry=reg)
    count = Gauge(wm.planner_count._name, "count", ["bucket", "gamma"], registry=reg)
    for e in snapshot.entries:
        loss.labels(bucket=str(e.bucket_lo), gamma=str(e.gamma)).set(e.mean_loss_s)
        count.labels(bucket=str(e.bucket_lo), gamma=str(e.gamma)).set(e.count)
    return generate_latest(reg).decode()


def regret_curve(oracle: OraclePolicy, step_log: list[tuple[int, int]], arms: tuple[int, ...], steps: int) -> list[float]:
    """Cumulative pseudo-regret after each of the first ``steps`` steps (true expected losses from the
    oracle baseline: profile step times over expected tokens under the workload's category mix)."""
    cache: dict[int, tuple[dict[int, float], float]] = {}
    out: list[float] = []
    tot = 0.0
    for b, g in step_log[:steps]:
        if b not in cache:
            losses = {a: oracle.expected_loss(b, a) for a in arms}
            cache[b] = (losses, min(losses.values()))
        losses, best = cache[b]
        tot += losses[g] - best
        out.append(tot)
    return out


def run_worker(profile: CostProfile, cfg: PlannerConfig, trace, seed: int, priors: PlannerPriors | None = None):
    reqs = make_requests(trace, seed)
    pol = build_policy(cfg.model_copy(update={"seed": seed}))
    if priors is not None:
        pol.set_priors(priors)
    res = Simulator(profile, reqs, seed=seed, record_steps=True).run(pol)
    return pol, res


def main(argv: list[str] | None = None) -> int:
    quick = os.environ.get("QUICK", "0") not in ("", "0")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default=str(DEFAULT_PROFILE))
    ap.add_argument("--fleet", type=int, default=3 if quick else 4, help="workers whose snapshots form the priors")
    ap.add_argument("--seeds", type=int, default=3 if quick else 8, help="held-out traces for the new worker")
    ap.add_argument("--steps", type=int, default=2000, help="regret horizon (decoding steps)")
    ap.add_argument("--low", type=float, default=2.0, help="requests/s at low load")
    ap.add_argument("--high", type=float, default=40.0, help="requests/s at high load")
    ap.add_argument("--phase", type=float, default=30.0 if quick else 60.0, help="seconds per load phase")
    ap.add_argument("--max-pseudo-count", type=float, default=PriorsConfig().max_pseudo_count)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)

    t0 = time.time()
    profile = CostProfile.load(args.profile)
    cfg = PlannerConfig(max_gamma=min(4, max(profile.gammas)), max_batch=profile.max_batch)
    arms = cfg.resolved_arms()
    trace = dynamic_trace(args.low, args.high, args.phase)
    oracle = OraclePolicy(cfg, profile, Workload().category_weights())

    # 1. The fleet: cold workers on their own traces; scrape-and-aggregate as the operator does.
    pods = {}
    for w in range(args.fleet):
        pol, res = run_worker(profile, cfg, trace, seed=1000 + w)
        pods[f"worker-{w}"] = extract(parse(exposition(pol.snapshot())), ts=0.0)
    fleet = aggregate(pods)
    priors = merge_priors(fleet.planner, cfg.edges(), arms, PriorsConfig(max_pseudo_count=args.max_pseudo_count))

    # 2. The new worker: cold vs warm on the same held-out traces.
    rows = []
    curves: dict[str, list[list[float]]] = {"cold": [], "warm": []}
    for s in range(args.seeds):
        seed = 1 + s
        _, cold = run_worker(profile, cfg, trace, seed)
        _, warm = run_worker(profile, cfg, trace, seed, priors)
        rc = regret_curve(oracle, cold.step_log or [], arms, args.steps)
        rw = regret_curve(oracle, warm.step_log or [], arms, args.steps)
        curves["cold"].append(rc)
        curves["warm"].append(rw)
        rows.append(
            {
                "seed": seed,
                "steps": min(len(rc), len(rw)),
                "cold_regret_s": rc[-1],
                "warm_regret_s": rw[-1],
                "cold_tok_s": cold.throughput_tok_s,
                "warm_tok_s": warm.throughput_tok_s,
                "cold_token_latency_ms": cold.mean_token_latency_s * 1e3,
                "warm_token_latency_ms": warm.mean_token_latency_s * 1e3,
            }
        )
    cold_sum = sum(r["cold_regret_s"] for r in rows)
    warm_sum = sum(r["warm_regret_s"] for r in rows)
    reduction = 1.0 - warm_sum / cold_sum if cold_sum > 0 else 0.0
    per_seed = [1.0 - r["warm_regret_s"] / r["cold_regret_s"] for r in rows if r["cold_regret_s"] > 0]

    hdr = f"{'seed':>4} {'steps':>5} {'cold regret ms':>14} {'warm regret ms':>14} {'reduction':>9} {'cold tok/s':>10} {'warm tok/s':>10}"
    print(f"profile {profile.name}; fleet of {args.fleet} workers -> {len(priors.entries)} prior entries "
          f"(pseudo-count <= {args.max_pseudo_count:g}); trace low {args.low}/s -> high {args.high}/s, phase {args.phase:g}s")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        red = 1.0 - r["warm_regret_s"] / r["cold_regret_s"] if r["cold_regret_s"] > 0 else 0.0
        print(f"{r['seed']:>4} {r['steps']:>5} {r['cold_regret_s'] * 1e3:>14.3f} {r['warm_regret_s'] * 1e3:>14.3f} "
              f"{red:>9.3f} {r['cold_tok_s']:>10.1f} {r['warm_tok_s']:>10.1f}")
    print(f"total cold regret {cold_sum * 1e3:.3f} ms, warm {warm_sum * 1e3:.3f} ms over the first {args.steps} steps per seed; "
          f"per-seed reduction median {statistics.median(per_seed):.3f} (min {min(per_seed):.3f})")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "warmstart-quick" if quick else "warmstart"
    (out / f"{tag}.json").write_text(
        json.dumps({"profile": profile.name, "fleet": args.fleet, "steps": args.steps, "rows": rows,
                    "regret_reduction": reduction, "priors_entries": len(priors.entries)}, indent=1) + "\n"
    )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for kind, color in (("cold", "tab:red"), ("warm", "tab:blue")):
            n = min(len(cv) for cv in curves[kind])
            mean = [sum(cv[i] for cv in curves[kind]) / len(curves[kind]) * 1e3 for i in range(n)]
            ax.plot(range(1, n + 1), mean, color=color, label=f"{kind} start")
        ax.set_xlabel("decoding step")
        ax.set_ylabel("cumulative pseudo-regret (ms)")
        ax.set_title(f"Warm start from fleet priors ({profile.name})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"{tag}.png", dpi=120)
        plt.close(fig)
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
    print(f"wrote {out / (tag + '.json')} and .png in {time.time() - t0:.1f}s")
    print(f"RESULT regret_reduction={reduction:.3f} cold_regret_ms={cold_sum / len(rows) * 1e3:.3f} "
          f"warm_regret_ms={warm_sum / len(rows) * 1e3:.3f} priors_entries={len(priors.entries)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
