"""Warm start from fleet priors: does a new worker learn faster with what the fleet already knows?

Setup (all in the step-level simulator, on one cost profile):

1. *Fleet*: ``--fleet`` workers, each serving its own request trace (different seeds) with a cold
   Nightjar planner. Their planner snapshots are exported exactly as a worker exports them
   (``nightjar_planner_loss_seconds`` / ``nightjar_planner_count`` in Prometheus text, names from
   ``nightjar_worker.metrics``), parsed and aggregated by the operator's fleet code
   (``promtext`` -> ``aggregate`` -> ``priors.merge_priors``, bounded pseudo-counts).
2. *New worker*: a held-out trace (same trace for both runs) served by a cold planner and by one
   warm-started with ``set_priors(fleet priors)``; same seed, same requests.

Regret of a step is the pseudo-regret ``L(b, gamma) - min_g L(b, g)`` with ``L`` the *simulator's own*
expected seconds per generated token at the step's batch size ``b``, measured by running every arm as
a static policy on the same traces (steps without merged prefill; batch sizes binned ~10 % wide).
The analytic oracle's cost model (step time over expected tokens under the request-count category
mix) is not used as the yardstick: in the simulator the running batch over-represents long,
low-acceptance requests and requests near their end cap the accepted tokens, so at batch 1 the best
arm is gamma 1-2, not the oracle's 3 (``--yardstick oracle`` reports against it anyway).
Regret is summed over the first ``--steps`` decoding steps of a trace that swings from low to high
load and back within those steps, averaged over ``--seeds`` held-out traces.

Last line: ``RESULT regret_reduction=<1 - warm regret / cold regret> ...`` (target >= 0.30).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from nightjar_contract.planner import DEFAULT_MAX_GAMMA
from nightjar_operator.fleet.aggregate import aggregate, extract
from nightjar_operator.fleet.priors import PriorsConfig, merge_priors
from nightjar_operator.fleet.promtext import parse
from nightjar_worker.planner import PlannerConfig, PlannerPriors, build_policy
from nightjar_worker.planner.oracle import OraclePolicy
from nightjar_worker.sim.profile import CostProfile
from nightjar_worker.sim.simulator import Simulator
from nightjar_worker.sim.workload import Workload, dynamic_trace, make_requests

from benchmarks.common import RESULTS_ROOT, is_quick

ROOT = Path(__file__).resolve().parent
RESULTS = RESULTS_ROOT
DEFAULT_PROFILE = ROOT / "profiles" / "roofline-h100-7b.json"


def exposition(snapshot: PlannerPriors) -> str:
    """A worker's planner gauges as its ``/metrics`` would show them (names from the worker module)."""
    from nightjar_worker import metrics as wm
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    reg = CollectorRegistry()
    labels = ["bucket", "gamma", "source"]
    loss = Gauge(wm.planner_loss_seconds._name, "loss", labels, registry=reg)
    count = Gauge(wm.planner_count._name, "count", labels, registry=reg)
    for e in snapshot.entries:
        loss.labels(bucket=str(e.bucket_lo), gamma=str(e.gamma), source=e.source).set(e.mean_loss_s)
        count.labels(bucket=str(e.bucket_lo), gamma=str(e.gamma), source=e.source).set(e.count)
    return generate_latest(reg).decode()


def batch_bin(b: int) -> int:
    """Exact batch sizes up to 8, then bins about 10 % wide."""
    return b if b <= 8 else 8 + round(math.log(b / 8) / math.log(1.1))


class StaticRecorder:
    """A static-gamma policy that records the time and tokens of each prefill-free step per batch bin."""

    def __init__(self, gamma: int, arms: tuple[int, ...], sums: dict[tuple[int, int], list[float]]) -> None:
        self.g, self._arms, self.sums = gamma, arms, sums
        self.name = f"static{gamma}"

    @property
    def arms(self) -> tuple[int, ...]:
        return self._arms

    def decide(self, batch_size: int, prompt_tokens: int = 0) -> int:
        return self.g

    def observe(self, fb) -> None:
        if getattr(fb, "prefill_tokens", 0) or fb.switch_cost_s:
            return
        acc = self.sums.setdefault((batch_bin(fb.batch_size), self.g), [0.0, 0.0, 0])
        acc[0] += fb.step_time_s
        acc[1] += fb.tokens_emitted
        acc[2] += 1


def measured_surface(profile: CostProfile, traces: list[tuple[list, int]], arms: tuple[int, ...],
                     min_samples: int = 10) -> dict[int, dict[int, float]]:
    """bin -> {gamma: loss} from static runs of every arm on the given (trace, seed) pairs. The loss is
    total time over total tokens (the latency per token requests see, and what the planner learns):
    the mean of per-step time/tokens overweights steps whose drafts were all rejected, and scored
    the planner against another objective than its own (docs/planner.md, "ratio of sums")."""
    sums: dict[tuple[int, int], list[float]] = {}
    for trace, seed in traces:
        reqs = make_requests(trace, seed)
        for g in arms:
            Simulator(profile, reqs, seed=seed).run(StaticRecorder(g, arms, sums))
    out: dict[int, dict[int, float]] = {}
    for (b, g), (t, tok, n) in sums.items():
        if n >= min_samples:
            out.setdefault(b, {})[g] = t / tok
    return {b: d for b, d in out.items() if len(d) == len(arms)}


def regret_curve(loss_of, step_log: list[tuple[int, int]], steps: int) -> tuple[list[float], int]:
    """Cumulative pseudo-regret after each of the first ``steps`` steps, and how many steps had no
    measured surface (skipped). ``loss_of(b)`` -> {gamma: expected loss} or None."""
    out: list[float] = []
    tot = 0.0
    skipped = 0
    for b, g in step_log[:steps]:
        losses = loss_of(b)
        if losses is None:
            skipped += 1
        else:
            tot += losses[g] - min(losses.values())
        out.append(tot)
    return out, skipped


def run_worker(profile: CostProfile, cfg: PlannerConfig, trace, seed: int, priors: PlannerPriors | None = None):
    reqs = make_requests(trace, seed)
    pol = build_policy(cfg.model_copy(update={"seed": seed}))
    if priors is not None:
        pol.set_priors(priors)
    res = Simulator(profile, reqs, seed=seed, record_steps=True).run(pol)
    return pol, res


def main(argv: list[str] | None = None) -> int:
    quick = is_quick()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default=str(DEFAULT_PROFILE))
    ap.add_argument("--fleet", type=int, default=3 if quick else 4, help="workers whose snapshots form the priors")
    ap.add_argument("--seeds", type=int, default=3 if quick else 8, help="held-out traces for the new worker")
    ap.add_argument("--steps", type=int, default=2000, help="regret horizon (decoding steps)")
    ap.add_argument("--low", type=float, default=2.0, help="requests/s at low load")
    ap.add_argument("--high", type=float, default=40.0, help="requests/s at high load")
    ap.add_argument("--fleet-phase", type=float, default=30.0, help="seconds per load phase of the fleet's traces")
    ap.add_argument("--phase", type=float, default=4.0,
                    help="seconds per load phase of the new worker's trace (low->high->low, repeated)")
    ap.add_argument("--max-pseudo-count", type=float, default=PriorsConfig().max_pseudo_count)
    ap.add_argument("--min-pseudo-count", type=float, default=PriorsConfig().min_pseudo_count)
    ap.add_argument("--min-fleet-count", type=float, default=PriorsConfig().min_fleet_count)
    ap.add_argument("--yardstick", choices=("measured", "oracle"), default="measured",
                    help="expected loss per (batch, gamma): measured in the simulator, or the analytic oracle's")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)

    t0 = time.time()
    profile = CostProfile.load(args.profile)
    cfg = PlannerConfig(max_gamma=min(DEFAULT_MAX_GAMMA, max(profile.gammas)), max_batch=profile.max_batch)
    arms = cfg.resolved_arms()
    fleet_trace = dynamic_trace(args.low, args.high, args.fleet_phase)
    trace = dynamic_trace(args.low, args.high, args.phase) * 3
    seeds = [1 + s for s in range(args.seeds)]

    # 1. The fleet: cold workers on their own traces; scrape-and-aggregate as the operator does.
    pods = {}
    for w in range(args.fleet):
        pol, _ = run_worker(profile, cfg, fleet_trace, seed=1000 + w)
        pods[f"worker-{w}"] = extract(parse(exposition(pol.snapshot())), ts=0.0)
    fleet = aggregate(pods)
    pcfg = PriorsConfig(max_pseudo_count=args.max_pseudo_count, min_pseudo_count=args.min_pseudo_count,
                        min_fleet_count=args.min_fleet_count)
    priors = merge_priors(fleet.planner, cfg.edges(), arms, pcfg)

    # The yardstick: the simulator's expected loss per (batch bin, gamma).
    if args.yardstick == "oracle":
        oracle = OraclePolicy(cfg, profile, Workload().category_weights())

        def loss_of(b: int):
            return {g: oracle.expected_loss(b, g) for g in arms}
    else:
        surface = measured_surface(profile, [(trace, s) for s in seeds] + [(fleet_trace, 2000)], arms)

        def loss_of(b: int):
            return surface.get(batch_bin(b))

    # 2. The new worker: cold vs warm on the same held-out traces.
    rows = []
    curves: dict[str, list[list[float]]] = {"cold": [], "warm": []}
    skipped = 0
    for seed in seeds:
        _, cold = run_worker(profile, cfg, trace, seed)
        _, warm = run_worker(profile, cfg, trace, seed, priors)
        rc, sc = regret_curve(loss_of, cold.step_log or [], args.steps)
        rw, sw = regret_curve(loss_of, warm.step_log or [], args.steps)
        skipped += sc + sw
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
    print(f"profile {profile.name}; fleet of {args.fleet} workers (phase {args.fleet_phase:g}s) -> {len(priors.entries)} "
          f"prior entries (pseudo-count {args.min_pseudo_count:g}-{args.max_pseudo_count:g}); new worker: low {args.low}/s -> high "
          f"{args.high}/s, phase {args.phase:g}s; yardstick {args.yardstick}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        red = 1.0 - r["warm_regret_s"] / r["cold_regret_s"] if r["cold_regret_s"] > 0 else 0.0
        print(f"{r['seed']:>4} {r['steps']:>5} {r['cold_regret_s'] * 1e3:>14.3f} {r['warm_regret_s'] * 1e3:>14.3f} "
              f"{red:>9.3f} {r['cold_tok_s']:>10.1f} {r['warm_tok_s']:>10.1f}")
    print(f"total cold regret {cold_sum * 1e3:.3f} ms, warm {warm_sum * 1e3:.3f} ms over the first {args.steps} steps per seed; "
          f"per-seed reduction median {statistics.median(per_seed):.3f} (min {min(per_seed):.3f}); "
          f"{skipped} of {2 * args.steps * len(rows)} steps outside the measured surface (not counted)")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "warmstart-quick" if quick else "warmstart"
    (out / f"{tag}.json").write_text(
        json.dumps({"profile": profile.name, "fleet": args.fleet, "steps": args.steps, "rows": rows,
                    "yardstick": args.yardstick, "skipped_steps": skipped,
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
