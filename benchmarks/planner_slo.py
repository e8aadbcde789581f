"""bench-planner's SLO study (issue 50 item 4): goodput against TTFT/TPOT targets, with and without
long prompts.

Every policy serves the same requests (common random numbers) on each shape, for two workloads:
the Spec-Bench mix and ``long prompts`` (the same categories, 300-900 prompt tokens, ~150 output
tokens: ``sim/workload.py``). Nightjar runs twice: with the targets (the goodput objective,
``planner/nightjar/objective.py``) and without (today's per-token objective). Per cell: goodput
(output tokens of the requests meeting both targets, per second of the window), attainment (the
fraction meeting both) and mean request latency (finish - arrival).

Targets, per profile and workload (a stated rule, not tuned per policy): TPOT = 1.25 x the plain
step at half the max batch; TTFT = 2 x (that step + the prefill of the workload's 90th-percentile
prompt merged into it). Both bind somewhere: plain decoding misses the TPOT at high load, a running
draft adds its prefill and its longer step to every first token.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from nightjar_contract.planner import DEFAULT_MAX_GAMMA, PlannerConfig
from nightjar_worker.planner import build_policy
from nightjar_worker.planner.oracle import OraclePolicy
from nightjar_worker.sim.profile import CostProfile
from nightjar_worker.sim.simulator import Simulator
from nightjar_worker.sim.workload import Workload, long_prompt_workload, make_requests

from benchmarks.common import print_table

K = DEFAULT_MAX_GAMMA
WORKLOADS: dict[str, Callable[[], Workload]] = {"spec-bench": Workload, "long prompts": long_prompt_workload}
# no saturated shape: past capacity every FIFO queue grows without bound and no policy meets a TTFT
SHAPES = ("low", "mid", "high", "dynamic", "bursty")
SEEDS = (3, 6)  # traces per cell (quick, full)
TraceFn = Callable[[str, float, bool], tuple[list[tuple[float, float]], float]]


def specs(targets: tuple[float, float]) -> dict[str, dict]:
    ttft, tpot = targets
    out: dict[str, dict] = {"nosd": {"policy": "nosd"}}
    for k in range(1, K + 1):
        out[f"static-{k}"] = {"policy": "static", "static_gamma": k}
    out["dsd"] = {"policy": "dsd"}
    out["nightjar (per token)"] = {"policy": "nightjar"}
    out["nightjar"] = {"policy": "nightjar", "slo_ttft_s": ttft, "slo_tpot_s": tpot}
    return out


def statics() -> list[str]:
    return ["nosd", *(f"static-{k}" for k in range(1, K + 1))]


def targets(profile: CostProfile, wl: Workload) -> tuple[float, float]:
    """(TTFT, TPOT) targets in seconds: see the module docstring."""
    b = max(1, profile.max_batch // 2)
    step = profile.step_time(b, 0)
    prompts = sorted(p for c in wl.categories for p in wl.spec[c]["prompt_tokens"])
    p90 = prompts[int(0.9 * (len(prompts) - 1))]
    probe = Simulator(profile, make_requests([(1.0, 5.0)], 0, wl))
    return 2.0 * (step + probe.prefill_time(b, p90)), 1.25 * step


def capacity_rps(profile: CostProfile, wl: Workload, quick: bool) -> float:
    """The oracle's throughput at overload in requests/s (as bench_planner's, for this workload)."""
    oracle = OraclePolicy(PlannerConfig(max_gamma=K, max_batch=profile.max_batch, policy="oracle"), profile,
                          wl.category_weights())
    b = profile.max_batch
    per_tok = min(oracle.expected_loss(b, g) for g in oracle.arms)
    pre_tok = max(profile.step_time(2 * b, 0) - profile.step_time(b, 0), 0.0) / b
    mean_prompt = sum(wl.spec[c]["weight"] * statistics.fmean(wl.spec[c]["prompt_tokens"]) for c in wl.categories)
    rate = 1.5 / (wl.mean_output_tokens() * per_tok + mean_prompt * pre_tok)
    n = 1200 if quick else 3000
    res = Simulator(profile, make_requests([(n / rate, rate)], 99, wl), seed=99).run(oracle, n / rate * 0.4)
    return res.throughput_tok_s / wl.mean_output_tokens()


def run_one(args: tuple) -> dict:
    profile_path, wl_name, name, spec, trace, warm, seed, tg = args
    profile = CostProfile.load(profile_path)
    wl = WORKLOADS[wl_name]()
    pol = build_policy(PlannerConfig(max_gamma=K, max_batch=profile.max_batch, seed=seed, **spec), profile)
    res = Simulator(profile, make_requests(trace, seed, wl), seed=seed).run(pol, measure_from_s=warm)
    o = res.slo(*tg)
    return {"policy": name, "goodput": o.goodput_tok_s, "attainment": o.attainment, "latency": o.mean_latency_s}


def study(profile_path: str, quick: bool, pool: ProcessPoolExecutor, out: Path, tag: str, trace_fn: TraceFn) -> dict:
    """Both workloads x every shape x every policy; returns the per-cell means and the worst ratio."""
    profile = CostProfile.load(profile_path)
    n_seeds = SEEDS[0 if quick else 1]
    tasks, keys = [], []
    tg_of: dict[str, tuple[float, float]] = {}
    for wl_name, make in WORKLOADS.items():
        wl = make()
        tg = tg_of[wl_name] = targets(profile, wl)
        cap = capacity_rps(profile, wl, quick)
        for shape in SHAPES:
            trace, warm = trace_fn(shape, cap, quick)
            for name, spec in specs(tg).items():
                for seed in range(1, 1 + n_seeds):
                    keys.append((wl_name, shape, name))
                    tasks.append((profile_path, wl_name, name, spec, trace, warm, seed, tg))
    raw: dict[tuple[str, str, str], list[dict]] = {}
    for key, r in zip(keys, pool.map(run_one, tasks), strict=True):
        raw.setdefault(key, []).append(r)
    mean = {k: {m: statistics.fmean(r[m] for r in rs) for m in ("goodput", "attainment", "latency")}
            for k, rs in raw.items()}
    ratios: dict[str, dict[str, float]] = {}
    spread: dict[str, dict[str, list[float]]] = {}
    for wl_name in WORKLOADS:
        ttft, tpot = tg_of[wl_name]
        ratios[wl_name], spread[wl_name] = {}, {}
        names = list(specs(tg_of[wl_name]))
        for shape in SHAPES:
            best = max(statics(), key=lambda p: mean[(wl_name, shape, p)]["goodput"])
            g_best = mean[(wl_name, shape, best)]["goodput"]
            nj = mean[(wl_name, shape, "nightjar")]["goodput"]
            ratios[wl_name][shape] = nj / g_best if g_best > 0 else 1.0
            spread[wl_name][shape] = [
                a["goodput"] / max(raw[(wl_name, shape, p)][i]["goodput"] for p in statics())
                for i, a in enumerate(raw[(wl_name, shape, "nightjar")])
                if max(raw[(wl_name, shape, p)][i]["goodput"] for p in statics()) > 0
            ]
        rows = []
        for name in names:
            rows.append([name, *(
                f"{mean[(wl_name, sh, name)]['goodput']:.4g} / {mean[(wl_name, sh, name)]['attainment']:.3f} / "
                f"{mean[(wl_name, sh, name)]['latency']:.3g}" for sh in SHAPES)])
        rows.append(["nightjar / best static goodput", *(f"{ratios[wl_name][sh]:.3f}" for sh in SHAPES)])
        rows.append(["  per trace (min-max)", *(
            f"{min(v):.3f}-{max(v):.3f}" if (v := spread[wl_name][sh]) else "-" for sh in SHAPES)])
        print_table(
            f"SLO ({tag}, {wl_name}): goodput tok/s / attainment / mean request latency s "
            f"(TTFT {ttft * 1e3:.4g} ms, TPOT {tpot * 1e3:.4g} ms)",
            ["policy", *SHAPES], rows, out / f"slo-{tag}-{wl_name.replace(' ', '-')}.md",
            notes=f"Mean of {n_seeds} traces per cell; shapes as the sources study (fractions of this workload's "
                  "capacity). Goodput: output tokens of the requests meeting both targets per second of the "
                  "window; best static: the best of gamma 0..K by goodput in each cell. 'nightjar' is given the "
                  "targets (goodput objective), 'nightjar (per token)' is not. " + (__doc__ or "").split("\n\n")[2]
                  .replace("\n", " "),
        )
    worst = min(v for by in ratios.values() for v in by.values())
    return {"goodput_vs_best_static": worst, "ratios": ratios, "targets_s": tg_of, "per_trace": spread,
            "cells": {" | ".join(k): v for k, v in mean.items()}}
