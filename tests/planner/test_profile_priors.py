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


def test_entries_are_the_profile_loss_at_each_buckets_middle_normalised_to_its_lower_edge(prof):
    cfg = PlannerConfig(max_gamma=4)  # default edges run to 192; the profile stops at batch 16
    pri = priors_from_profile(prof, cfg)
    assert pri.bucket_edges == cfg.bucket_edges
    los = sorted({e.bucket_lo for e in pri.entries})
    assert los == [lo for lo in cfg.bucket_edges if lo <= prof.batch_sizes[-1]]
    assert {e.gamma for e in pri.entries} == {0, 1, 2, 3, 4}
    middle = {1: 1, 2: 2, 3: 3, 4: 4, 6: 6, 8: 9, 12: 13, 16: 16}  # sqrt(lo x hi), within the profile's 16
    for e in pri.entries:
        m = middle[e.bucket_lo]
        # what a worker measures there: the step at the middle batch, normalised by m / lower edge
        assert e.mean_loss_s == pytest.approx(prof.expected_loss(m, e.gamma) * m / e.bucket_lo)
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
    # with the source model (shared acceptance, predicted arms) the cold planner itself pays less:
    # cold 982 -> 603, warm 305 -> 306 (ratio 0.31 -> 0.51); the priors at each bucket's middle
    # batch, not its lower edge: ratio 0.53 -> 0.17
    assert regret[True] < 0.6 * regret[False], regret


# -- with speculation sources ---------------------------------------------------------------------
BUNDLED_CPU = QWEN_CPU.with_name("cpu-smollm2-135m.json")


def test_profile_priors_carry_every_host_source_arm(prof):
    from nightjar_worker.sim.sources import SourceTable

    cfg = PlannerConfig(max_gamma=4, ngram_arms=[1, 2, 3, 4])
    table = SourceTable.for_profile(prof)
    pri = priors_from_profile(prof, cfg, sources=table)
    ngram = [e for e in pri.entries if e.source == "ngram"]
    assert {e.gamma for e in ngram} == {1, 2, 3, 4}
    e = next(x for x in ngram if x.bucket_lo == 1 and x.gamma == 2)
    from nightjar_worker.sim.profile import expected_tokens

    assert e.mean_loss_s == pytest.approx(table["ngram"].step_time(prof, 1, 2)
                                          / expected_tokens(2, table["ngram"].acceptance(prof)))
    # the planner reads each entry into its own arm
    pol = build_policy(cfg, prof)
    pol.set_priors(pri)  # type: ignore[attr-defined]
    est = pol.estimates(1)  # type: ignore[attr-defined]
    assert est[("ngram", 2)] == pytest.approx(e.mean_loss_s, rel=0.02)
    assert est[("draft", 2)] == pytest.approx(prof.expected_loss(1, 2), rel=0.02)


def test_a_prior_entry_is_one_per_bucket_gamma_and_source():
    from nightjar_contract.planner import PlannerPriors, PriorEntry
    from pydantic import ValidationError

    ok = [PriorEntry(bucket_lo=1, gamma=2, mean_loss_s=0.1), PriorEntry(bucket_lo=1, gamma=2, mean_loss_s=0.1, source="ngram")]
    PlannerPriors(bucket_edges=[1, 2], entries=ok)
    with pytest.raises(ValidationError, match="duplicate entry for bucket_lo=1 gamma=2 source=ngram"):
        PlannerPriors(bucket_edges=[1, 2], entries=[*ok, ok[1]])


def test_short_runs_over_nine_arms_lose_to_cold_start_and_profile_priors_fix_it():
    """The real engine's nightjar-both at 0.80-0.93 of the best static arm (bench-ngram QUICK: a few
    requests of 48 tokens, ~100-200 steps): the same cell in the simulator loses as much cold, and
    starts at the best arm warm from the profile's and the source table's priors."""
    import random
    import statistics

    from nightjar_worker.sim.simulator import Simulator
    from nightjar_worker.sim.sources import SourceTable
    from nightjar_worker.sim.workload import Request

    def _requests(cats: list[str], n: int, seed: int) -> list[Request]:  # a closed loop: all at t=0
        rng, spec = random.Random(seed), Workload().spec
        return [Request(i, i * 1e-6, c, rng.choice(spec[c]["prompt_tokens"]), 48)
                for i, c in enumerate(rng.choice(cats) for _ in range(n))]

    prof = CostProfile.load(BUNDLED_CPU)
    table = SourceTable.for_profile(prof)
    cats = ["summarization", "reasoning", "coding"]

    def tok_s(spec: dict, warm: bool = False) -> float:
        out = []
        for seed in range(6):
            cfg = PlannerConfig(max_gamma=4, max_batch=4, seed=seed, **spec)
            pol = build_policy(cfg, prof)
            if warm:
                pol.set_priors(priors_from_profile(prof, cfg, sources=table))  # type: ignore[attr-defined]
            res = Simulator(prof, _requests(cats, 16, seed), max_batch=4, seed=seed, sources=table).run(pol)
            out.append(res.total_tokens / res.busy_s)
        return statistics.fmean(out)

    best = max(tok_s({"policy": "static", "static_gamma": g, "static_source": "ngram"}) for g in (1, 2, 3, 4))
    both = {"policy": "nightjar", "ngram_arms": [1, 2, 3, 4]}
    assert tok_s(both) < 0.85 * best
    assert tok_s(both, warm=True) > 0.97 * best
