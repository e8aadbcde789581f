"""Speculation sources in the simulator: the calibrated table, per-source costs and acceptance,
the draft offloaded, the multi-source oracle, and the measured-vs-simulated ranking."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nightjar_worker.planner import PlannerConfig, build_policy
from nightjar_worker.planner.oracle import OraclePolicy
from nightjar_worker.sim.profile import CostProfile
from nightjar_worker.sim.simulator import Simulator
from nightjar_worker.sim.sources import SOURCES_PATH, Source, SourceTable, alpha_from_rate, rate_at
from nightjar_worker.sim.workload import Request, Workload, make_requests

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "benchmarks" / "profiles"
BUNDLED = PROFILES / "cpu-smollm2-135m.json"
QWEN = PROFILES / "cpu-qwen2.5-coder-1.5b-0.5b-fp32.json"
ROOFLINE = PROFILES / "roofline-h100-7b.json"


@pytest.mark.parametrize("gamma", [1, 2, 3, 4])
@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.55, 0.9])
def test_alpha_from_rate_inverts_the_geometric_rate(gamma, alpha):
    assert alpha_from_rate(rate_at(gamma, alpha), gamma) == pytest.approx(alpha, abs=2e-4)


def test_a_rate_outside_0_1_is_refused():
    with pytest.raises(ValueError, match="rate"):
        alpha_from_rate(1.2, 3)


@pytest.mark.parametrize("path", [BUNDLED, QWEN, ROOFLINE])
def test_every_committed_profile_has_a_calibrated_ngram_source(path):
    prof = CostProfile.load(path)
    table = SourceTable.for_profile(prof)
    assert table.names()[:2] == ("draft", "ngram")
    ng = table["ngram"]
    assert not ng.runs_draft and table["draft"].runs_draft
    # a category's acceptance is its own, not the mean: the calibration separates them
    wl = Workload()
    alphas = {c: ng.acceptance(prof, c) for c in wl.categories}
    assert max(alphas.values()) - min(alphas.values()) > 0.1
    # the draft's acceptance stays the profile's
    assert table["draft"].acceptance(prof, "coding") == prof.alpha("coding")


@pytest.mark.parametrize("path", [BUNDLED, ROOFLINE])
def test_the_suffix_source_is_calibrated_from_bench_sources(path):
    """The bundled pair's bench-sources run (``benchmarks.sources_calibration``; the roofline takes the
    CPU pairs' mean): suffix drafts are accepted more on tasks asked again than on fresh prompts, and
    a suffix step pays a host lookup per request (Arctic's tree) on top of the target's verification."""
    prof = CostProfile.load(path)
    table = SourceTable.for_profile(prof)
    assert table.names() == ("draft", "ngram", "suffix")
    sfx = table["suffix"]
    assert not sfx.runs_draft
    fresh = [c for c in Workload().categories if c in sfx.alpha]
    assert fresh, "no Spec-Bench category calibrated"
    assert sfx.acceptance(prof, "same-task") > max(sfx.acceptance(prof, c) for c in fresh)
    assert sfx.lookup_s_per_request > 0  # timed on Arctic's tree by the calibration
    for b in (1, 8):
        assert sfx.step_time(prof, b, 0) == prof.step_time(b, 0) < sfx.step_time(prof, b, 2)


def test_an_uncalibrated_source_is_refused_by_name():
    table = SourceTable.for_profile(CostProfile.load(QWEN))  # no bench-sources run of the Qwen pair
    with pytest.raises(ValueError, match="'suffix' is not calibrated"):
        table["suffix"]


def test_a_bad_source_entry_names_its_field():
    with pytest.raises(ValueError, match=r"sources\.x\.alpha\.qa"):
        Source("x", "host", {"qa": 1.5})
    with pytest.raises(ValueError, match=r"sources\.x\.proposer"):
        Source("x", "gpu")


def _with_suffix(tmp_path, prof: CostProfile, alpha: float) -> SourceTable:
    """The committed table plus a ``suffix`` host entry for ``prof`` (acceptance ``alpha``)."""
    data = json.loads(SOURCES_PATH.read_text())
    data["profiles"][prof.name]["sources"]["suffix"] = {"proposer": "host", "alpha": {"all": alpha},
                                                        "verify_per_draft_token": 0.1}
    p = tmp_path / "sources.json"
    p.write_text(json.dumps(data))
    return SourceTable.for_profile(prof, p)


def test_a_third_source_is_one_more_entry(tmp_path):
    prof = CostProfile.load(BUNDLED)
    table = _with_suffix(tmp_path, prof, 0.5)
    assert table.names() == ("draft", "ngram", "suffix")
    assert table["suffix"].step_time(prof, 1, 2) == pytest.approx(prof.step_time(1, 0) * 1.2)


def test_a_host_source_costs_verification_not_a_draft_forward():
    prof = CostProfile.load(ROOFLINE)
    ng = SourceTable.for_profile(prof)["ngram"]
    for b in (1, 16, 256):
        for g in (1, 3):
            # cheaper than the draft model's step (no draft forwards), dearer than a plain step
            assert prof.step_time(b, 0) < ng.step_time(prof, b, g) < prof.step_time(b, g)


def _static(prof, gamma, source="draft"):
    return build_policy(PlannerConfig(policy="static", static_gamma=gamma, static_source=source, max_gamma=4,
                                      max_batch=prof.max_batch), prof)


def _closed_loop(categories, n=16, c=4):
    wl = Workload()
    return [Request(i, i * 1e-6, categories[i % len(categories)], wl.spec[categories[0]]["prompt_tokens"][0], 48)
            for i in range(n)]


def test_acceptance_is_drawn_per_source_and_category():
    """Bundled pair: the draft is never accepted, prompt lookup is, more on repetitive categories."""
    prof = CostProfile.load(BUNDLED)
    table = SourceTable.for_profile(prof)
    steps = {}
    for cat in ("extraction", "coding"):
        for src in ("draft", "ngram"):
            res = Simulator(prof, _closed_loop([cat]), max_batch=4, sources=table).run(_static(prof, 3, src))
            steps[(cat, src)] = res.steps
    assert steps[("extraction", "draft")] == steps[("coding", "draft")]  # acceptance 0: one token a step
    assert steps[("extraction", "ngram")] < steps[("coding", "ngram")] < steps[("coding", "draft")]


def test_offloaded_draft_frees_its_blocks_and_its_arms():
    prof = CostProfile.load(QWEN)
    table = SourceTable.for_profile(prof)
    reqs = make_requests([(60.0, 0.3)], 3)
    resident = Simulator(prof, reqs, sources=table).run(_static(prof, 2))
    off = Simulator(prof, reqs, sources=table, draft_resident=False).run(_static(prof, 2))
    assert off.kv_budget_blocks == resident.kv_budget_blocks + prof.draft_blocks()
    assert set(off.gamma_steps) == {0} and resident.gamma_steps.get(2, 0) > 0  # clamped to plain steps
    ngram = Simulator(prof, reqs, sources=table, draft_resident=False).run(_static(prof, 2, "ngram"))
    assert ngram.arm_steps.get("ngram-2", 0) > 0 and ngram.switches_on == 0
    # Nightjar is told the draft is away and plays no draft arm
    nj = build_policy(PlannerConfig(max_gamma=4, max_batch=prof.max_batch, ngram_arms=[1, 2, 3, 4]), prof)
    res = Simulator(prof, reqs, sources=table, draft_resident=False).run(nj)
    assert not any(k.startswith("draft-") for k in res.arm_steps)


def _oracle(prof, table):
    cfg = PlannerConfig(policy="oracle", max_gamma=4, max_batch=prof.max_batch)
    return OraclePolicy(cfg, prof, Workload().category_weights(), sources=table)


def test_the_sources_oracle_plays_the_cheapest_arm_over_every_source():
    prof = CostProfile.load(BUNDLED)  # the draft is never accepted: prompt lookup or plain steps
    table = SourceTable.for_profile(prof)
    o = _oracle(prof, table)
    for b in (1, 4, 16, 32):
        g = o.decide(b)
        best = min(o.keys, key=lambda k: o.expected_loss(b, k[1], k[0]))
        assert (o.source() if g else "draft", g) == (best[0] if best[1] else "draft", best[1])
        assert o.source() != "draft" or g == 0
    # draft-only table: the single-source oracle's choices
    single = OraclePolicy(PlannerConfig(policy="oracle", max_gamma=4, max_batch=prof.max_batch), prof,
                          Workload().category_weights())
    assert all(single.decide(b) == 0 for b in (1, 8, 32))


def test_the_sources_oracle_is_no_worse_than_any_static_arm_in_the_simulator():
    prof = CostProfile.load(QWEN)
    table = SourceTable.for_profile(prof)
    reqs = make_requests([(120.0, 0.4)], 5)
    lat = {}
    for name, pol in {"oracle": _oracle(prof, table), "nosd": _static(prof, 0), "draft-2": _static(prof, 2),
                      "ngram-2": _static(prof, 2, "ngram")}.items():
        lat[name] = Simulator(prof, reqs, sources=table, seed=5).run(pol).mean_token_latency_s
    assert lat["oracle"] <= min(v for k, v in lat.items() if k != "oracle") * 1.01


def test_the_regret_environment_counts_every_source_against_the_multi_source_oracle():
    from nightjar_worker.sim.regret import RegretEnv, batch_contexts

    prof = CostProfile.load(BUNDLED)
    table = SourceTable.for_profile(prof)
    wl = Workload().category_weights()
    cfg = PlannerConfig(max_gamma=4, max_batch=prof.max_batch, ngram_arms=[1, 2, 3, 4])
    env = RegretEnv(prof, wl, cfg.resolved_arms(), batch_contexts(3000, 1, prof.max_batch), seed=1, sources=table)
    assert ("ngram", 2) in env.moments and ("draft", 2) in env.moments
    oracle = env.run(OraclePolicy(cfg, prof, wl, sources=table))
    ngram = env.run(_static(prof, 2, "ngram"))
    draft = env.run(_static(prof, 2))
    # the draft is never accepted on this pair: its arm loses far more than prompt lookup's (which is
    # the oracle's choice at every batch here)
    assert sum(oracle.losses_s) <= sum(ngram.losses_s) + 1e-9
    assert sum(ngram.losses_s) + 0.1 * ngram.time_s < sum(draft.losses_s)
    # c*(B) is over every source: the oracle's steps cost about what the best arm needs (noise only)
    assert abs(sum(oracle.losses_s)) < 0.05 * oracle.time_s


def test_a_suffix_source_is_simulated_and_planned_like_prompt_lookup(tmp_path):
    """A calibrated ``suffix`` host entry (any host source is generic): its static arm never needs the
    draft (its blocks are KV cache), and Nightjar with ``suffix_arms`` plays it, the draft offloaded."""
    prof = CostProfile.load(QWEN)
    table = _with_suffix(tmp_path, prof, 0.85)
    reqs = make_requests([(60.0, 0.3)], 3)
    draft = Simulator(prof, reqs, sources=table).run(_static(prof, 2))
    sfx = Simulator(prof, reqs, sources=table).run(_static(prof, 2, "suffix"))
    assert sfx.kv_budget_blocks == draft.kv_budget_blocks + prof.draft_blocks()
    assert sfx.arm_steps.get("suffix-2", 0) > 0 and sfx.switches_on == 0
    cfg = PlannerConfig(max_gamma=4, max_batch=prof.max_batch, ngram_arms=[1, 2, 3, 4], suffix_arms=[1, 2, 3, 4])
    res = Simulator(prof, reqs, sources=table, draft_resident=False).run(build_policy(cfg, prof))
    assert not any(k.startswith("draft-") for k in res.arm_steps)
    played: dict[str, int] = {}
    for k, n in res.arm_steps.items():
        played[k.split("-")[0]] = played.get(k.split("-")[0], 0) + n
    assert played.get("suffix", 0) > played.get("ngram", 0)  # accepted far more often here
