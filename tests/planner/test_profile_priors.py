"""Priors derived from a measured cost profile: the planner's units, and a warm start that pays."""

from __future__ import annotations

from pathlib import Path

import pytest
from nightjar_worker.planner import PlannerConfig, build_policy
from nightjar_worker.planner.oracle import OraclePolicy
from nightjar_worker.planner.profile_priors import priors_from_profile
from nightjar_worker.sim.profile import CostProfile
from nightjar_worker.sim.regret import RegretEnv, batch_contexts
from nightjar_worker.sim.workload import Workload

QWEN_CPU = Path(__file__).resolve().parents[2] / "benchmarks" / "profiles" / "cpu-qwen2.5-coder-1.5b-0.5b-fp32.json"


@pytest.fixture(scope="module")
def prof() -> CostProfile:
    return CostProfile.load(QWEN_CPU)


def test_entries_are_the_profile_loss_at_each_lower_edge_within_its_range(prof):
    cfg = PlannerConfig(max_gamma=4)  # default edges run to 192; the profile stops at batch 16
    pri = priors_from_profile(prof, cfg)
    assert pri.bucket_edges == cfg.bucket_edges
    los = sorted({e.bucket_lo for e in pri.entries})
    assert los == [lo for lo in cfg.bucket_edges if lo <= prof.batch_sizes[-1]]
    assert {e.gamma for e in pri.entries} == {0, 1, 2, 3, 4}
    for e in pri.entries:
        assert e.mean_loss_s == pytest.approx(prof.expected_loss(e.bucket_lo, e.gamma))
        assert e.count == cfg.prior_max_count
    assert all(e.count == 5 for e in priors_from_profile(prof, cfg, count=5).entries)
    # the draft's prefill per prompt token travels too: measured when the profile has it, else the
    # catch-up's per-token rate (this profile predates the measurement)
    assert prof.draft_prefill_s_per_token == 0.0
    assert pri.draft_prefill_s_per_token == pytest.approx(prof.switch_cost_per_token_s)
    measured = prof.model_copy(update={"draft_prefill_s_per_token": 0.0063})
    assert priors_from_profile(measured, cfg).draft_prefill_s_per_token == pytest.approx(0.0063)


def test_a_planner_warm_started_from_the_profile_learns_with_less_regret(prof):
    # The first 3000 steps of the regret environment: exploring a cold bucket costs, a warm one
    # plays what the profile says and only confirms it. Many seeds: one run's regret is mostly
    # whether a near tie (an arm vs turning speculation off) locks in for a few hundred steps, so
    # it ranges over two orders of magnitude from seed to seed, warm or cold. 24 seeds: warm 0.60 %
    # of the oracle's time against cold 2.02 % (ratio 0.30); before turning the draft off was
    # priced by the context's excursions, 1.55 % against 4.38 % (0.35).
    wl = Workload().category_weights()
    regret = {False: 0.0, True: 0.0}
    for seed in range(24):
        cfg = PlannerConfig(max_gamma=4, max_batch=prof.max_batch, seed=seed)
        env = RegretEnv(prof, wl, cfg.resolved_arms(), batch_contexts(3000, seed, prof.max_batch), seed=seed)
        best = sum(env.run(OraclePolicy(cfg, prof, wl)).losses_s)  # each run replays the same noise
        for warm in (False, True):
            pol = build_policy(cfg, prof)
            if warm:
                pol.set_priors(priors_from_profile(prof, cfg))
            regret[warm] += sum(env.run(pol).losses_s) - best
    assert regret[True] < 0.5 * regret[False], regret
