"""Priors merging and SLO evaluation."""

from __future__ import annotations

import math

import pytest
from nightjar_contract.planner import PlannerConfig, PlannerPriors
from nightjar_operator.fleet.aggregate import FleetStats
from nightjar_operator.fleet.priors import PriorsConfig, merge_priors, priors_equal
from nightjar_operator.fleet.promtext import Histogram
from nightjar_operator.fleet.slo import condition, evaluate_slo
from pydantic import ValidationError


def test_merge_priors_bounds_pseudo_counts_and_maps_buckets():
    edges = PlannerConfig().edges()
    fleet = {
        (1, 2): (0.010, 1000.0),  # lots of evidence -> capped
        (8, 0): (0.020, 8.0),  # little -> weight * n
        (8, 9): (0.020, 100.0),  # gamma outside arms -> dropped
        (5, 1): (0.030, 10.0),  # 5 is not an edge: falls in bucket 4
        (4, 1): (0.060, 30.0),  # merged with (5, 1) by count weight
        (16, 3): (0.030, 1.0),  # below min_fleet_count
    }
    pri = merge_priors(fleet, edges, arms=range(5),
                       config=PriorsConfig(weight=0.5, max_pseudo_count=16, min_pseudo_count=0, min_fleet_count=3))
    got = {(e.bucket_lo, e.gamma): (e.mean_loss_s, e.count) for e in pri.entries}
    assert {e.source for e in pri.entries} == {"draft"}  # keys without a source are the draft model's
    assert got[(1, 2)] == (0.010, 16.0)
    assert got[(8, 0)] == (0.020, 4.0)
    assert (8, 9) not in got and (16, 3) not in got
    assert got[(4, 1)][0] == pytest.approx((0.03 * 10 + 0.06 * 30) / 40) and got[(4, 1)][1] == 16.0
    assert pri.bucket_edges == list(edges)
    # valid PlannerPriors (round-trips through its own validation)
    PlannerPriors.model_validate(pri.model_dump())


def test_every_measured_entry_is_worth_the_floor():
    # Workers' counts are discounted: gamma 0 at batch 1, ruled out by every worker early on, keeps
    # its mean (60 % worse) but decays to a fraction of an observation. Dropped or weighted by that
    # count, it is explored again by every new worker; by default it is worth as much as any entry.
    fleet = {(1, 0): (0.0062, 0.23), (1, 3): (0.0039, 1450.0)}
    got = {(e.bucket_lo, e.gamma): e.count for e in merge_priors(fleet, [1, 2, 4]).entries}
    assert got == {(1, 0): 64.0, (1, 3): 64.0}
    low = merge_priors(fleet, [1, 2, 4], config=PriorsConfig(min_pseudo_count=8, max_pseudo_count=16))
    assert {(e.bucket_lo, e.gamma): e.count for e in low.entries} == {(1, 0): 8.0, (1, 3): 16.0}


def test_priors_keep_each_sources_arms_apart():
    # what the operator's aggregation gives: (bucket, gamma, source); gamma 0 is the plain arm
    fleet = {
        (4, 2, "draft"): (0.030, 100.0),
        (4, 2, "ngram"): (0.018, 80.0),
        (5, 2, "ngram"): (0.022, 20.0),  # falls in bucket 4: merged with the n-gram entry only
        (4, 0, "draft"): (0.040, 50.0),
        (4, 3, "ngram"): (0.020, 50.0),  # not an n-gram arm of this deployment
        (4, 2, "suffix"): (0.015, 50.0),  # no suffix arms here
    }
    pri = merge_priors(fleet, [1, 4, 8], arms=range(5), host_arms={"ngram": (2,)})
    got = {(e.bucket_lo, e.gamma, e.source): e.mean_loss_s for e in pri.entries}
    assert got == {(4, 2, "draft"): 0.030, (4, 2, "ngram"): pytest.approx((0.018 * 80 + 0.022 * 20) / 100),
                   (4, 0, "draft"): 0.040}
    # without host_arms every source's entries go (the planner ignores arms it does not have)
    assert {e.source for e in merge_priors(fleet, [1, 4, 8], arms=range(5)).entries} == {"draft", "ngram", "suffix"}
    # a change of one source's estimate is a change
    moved = merge_priors({**fleet, (4, 2, "ngram"): (0.030, 80.0)}, [1, 4, 8], arms=range(5), host_arms={"ngram": (2,)})
    assert not priors_equal(pri, moved)


def test_priors_equal_ignores_noise():
    edges = [1, 2, 4]
    a = merge_priors({(1, 1): (0.01, 100.0)}, edges)
    b = merge_priors({(1, 1): (0.01005, 101.0)}, edges)
    c = merge_priors({(1, 1): (0.02, 100.0)}, edges)
    assert priors_equal(a, b) and not priors_equal(a, c) and not priors_equal(a, None)
    # the fleet's draft prefill price rides along, and a material change of it is a change
    d = merge_priors({(1, 1): (0.01, 100.0)}, edges, draft_prefill_s_per_token=0.006)
    assert d.draft_prefill_s_per_token == 0.006
    assert not priors_equal(a, d)
    assert priors_equal(d, merge_priors({(1, 1): (0.01, 100.0)}, edges, draft_prefill_s_per_token=0.00605))
    assert not priors_equal(d, merge_priors({(1, 1): (0.01, 100.0)}, edges, draft_prefill_s_per_token=0.008))


def test_priors_config_names_field():
    with pytest.raises(ValidationError, match="max_pseudo_count"):
        PriorsConfig(max_pseudo_count=-1)


def _stats(ttft_buckets, tpot_buckets=None):
    st = FleetStats(pods=2)
    st.ttft = Histogram.from_buckets(ttft_buckets)
    st.tpot = Histogram.from_buckets(tpot_buckets) if tpot_buckets else None
    return st


def test_slo_met_and_missed_and_message():
    good = _stats([(0.1, 97), (0.5, 100), (math.inf, 100)], [(0.02, 99), (0.05, 100), (math.inf, 100)])
    ev = evaluate_slo(good, ttft_p95_ms=100, tpot_p95_ms=50)
    assert ev.status == "True" and ev.reason == "TargetsMet"
    assert ev.attainment == pytest.approx(0.97)
    assert "ttft p95=" in ev.message and "attainment=0.970" in ev.message and "tpot p95=" in ev.message
    bad = _stats([(0.1, 50), (0.5, 100), (math.inf, 100)])
    ev2 = evaluate_slo(bad, ttft_p95_ms=100, tpot_p95_ms=None)
    assert ev2.status == "False" and ev2.reason == "TargetsMissed" and ev2.attainment == pytest.approx(0.5)
    assert ev2.ttft_p95_s == pytest.approx(0.1 + 0.4 * 45 / 50)


def test_slo_unknown_without_traffic_or_targets():
    empty = _stats([(0.1, 0), (math.inf, 0)])
    assert evaluate_slo(empty, 100, None).reason == "NoTraffic"
    assert evaluate_slo(empty, None, None).reason == "NoTargets"
    assert evaluate_slo(FleetStats(), None, 30).status == "Unknown"
    with pytest.raises(ValueError, match="objective"):
        evaluate_slo(empty, 100, None, objective=0)


def test_condition_keeps_transition_time():
    ev = evaluate_slo(_stats([(0.1, 100), (math.inf, 100)]), 100, None)
    c1 = condition(ev, 3, "2024-01-01T00:00:00Z")
    c2 = condition(ev, 4, "2024-01-01T00:01:00Z", previous=c1)
    assert c2["lastTransitionTime"] == "2024-01-01T00:00:00Z" and c2["observedGeneration"] == 4
    assert c2["type"] == "SLOMet" and c2["status"] == "True"
