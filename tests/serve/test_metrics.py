"""nightjar_* metrics: the recorder's semantics, and the multiprocess export path (a metric recorded
in one process, as in vLLM's EngineCore, is served by another process's registry)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from nightjar_worker.metrics import WorkerMetrics
from nightjar_worker.planner import PlannerConfig, PlannerPriors, build_policy
from nightjar_worker.planner.policy import PlannerStats
from prometheus_client import REGISTRY


def v(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_step_recording_counts_arms_switches_and_acceptance():
    m = WorkerMetrics(acceptance_decay=1.0)
    d, n = {"gamma": "3", "source": "draft"}, {"gamma": "3", "source": "ngram"}
    s0, on0, off0 = v("nightjar_steps_total", **d), v("nightjar_switches_total", direction="on"), v(
        "nightjar_switches_total", direction="off")
    d0, a0 = v("nightjar_draft_tokens_total", **d), v("nightjar_accepted_tokens_total", **d)
    nd0, na0 = v("nightjar_draft_tokens_total", **n), v("nightjar_accepted_tokens_total", **n)
    m.observe_step(0, 4)
    m.observe_step(3, 4, num_draft_tokens=12, num_accepted_tokens=6)
    m.observe_step(3, 4, num_draft_tokens=12, num_accepted_tokens=12)
    m.observe_step(0, 8)
    # n-gram drafts: counted under their source; the draft model stays off (no switch either way)
    m.observe_step(3, 8, num_draft_tokens=24, num_accepted_tokens=6, source="ngram")
    # the next step goes back to the draft model but verifies the n-gram step's drafts
    m.observe_step(3, 8, num_draft_tokens=8, num_accepted_tokens=0, source="draft", drafts_source="ngram")
    m.observe_step(0, 8)
    assert v("nightjar_steps_total", **d) - s0 == 3
    assert v("nightjar_switches_total", direction="on") - on0 == 2
    assert v("nightjar_switches_total", direction="off") - off0 == 2
    assert v("nightjar_draft_tokens_total", **d) - d0 == 24
    assert v("nightjar_accepted_tokens_total", **d) - a0 == 18
    assert v("nightjar_acceptance_rate", **d) == pytest.approx(18 / 24)
    assert (v("nightjar_draft_tokens_total", **n) - nd0, v("nightjar_accepted_tokens_total", **n) - na0) == (32, 6)
    assert v("nightjar_acceptance_rate", **n) == pytest.approx(6 / 32)
    assert v("nightjar_gamma_current") == 0
    # the suffix trees: a third source, like the n-gram one (no switch of the draft model), with
    # their lookups' hit rate and the cache's size (bytes only on the steps the worker measured it)
    x = {"gamma": "2", "source": "suffix"}
    sx0, h0, mi0 = (v("nightjar_steps_total", **x), v("nightjar_suffix_lookups_total", result="hit"),
                    v("nightjar_suffix_lookups_total", result="miss"))
    on0, off0 = v("nightjar_switches_total", direction="on"), v("nightjar_switches_total", direction="off")
    m.observe_step(2, 8, num_draft_tokens=10, num_accepted_tokens=7, source="suffix")
    m.observe_suffix(lookups=8, hits=5, cache_bytes=123456, cached_requests=40)
    m.observe_step(2, 8, num_draft_tokens=4, num_accepted_tokens=1, source="suffix")
    m.observe_suffix(lookups=8, hits=2, cache_bytes=None, cached_requests=41)
    m.observe_step(0, 8)
    assert v("nightjar_steps_total", **x) - sx0 == 2
    assert v("nightjar_acceptance_rate", **x) == pytest.approx(8 / 14)
    assert (v("nightjar_switches_total", direction="on") - on0, v("nightjar_switches_total", direction="off") - off0) == (0, 0)
    assert (v("nightjar_suffix_lookups_total", result="hit") - h0, v("nightjar_suffix_lookups_total", result="miss") - mi0) == (7, 9)
    assert (v("nightjar_suffix_cache_bytes"), v("nightjar_suffix_cached_requests")) == (123456, 41)


def test_gamma_histogram_buckets_are_per_arm():
    m = WorkerMetrics()
    le0, le2 = v("nightjar_gamma_chosen_bucket", le="0.0"), v("nightjar_gamma_chosen_bucket", le="2.0")
    m.observe_step(2, 1)
    assert v("nightjar_gamma_chosen_bucket", le="0.0") == le0
    assert v("nightjar_gamma_chosen_bucket", le="2.0") == le2 + 1


def test_planner_snapshot_formats():
    m = WorkerMetrics()
    pol = build_policy(PlannerConfig())
    pol.set_priors(PlannerPriors(bucket_edges=[1, 64], entries=[{"bucket_lo": 64, "gamma": 1, "mean_loss_s": 0.02}]))
    m.set_planner_snapshot(pol.snapshot())
    assert v("nightjar_planner_loss_seconds", bucket="64", gamma="1", source="draft") == pytest.approx(0.02)
    m.set_planner_snapshot({(96, 2): (0.5, 7.0)})  # a key without a source is the draft model's
    assert v("nightjar_planner_count", bucket="96", gamma="2", source="draft") == 7.0
    m.set_planner_snapshot({(96, 2, "ngram"): (0.25, 3.0)})
    assert v("nightjar_planner_count", bucket="96", gamma="2", source="ngram") == 3.0
    assert v("nightjar_planner_loss_seconds", bucket="96", gamma="2", source="draft") == 0.5  # its own series


def test_planner_snapshot_exports_every_sources_arms():
    # gamma 2 of the draft model and of prompt lookup are two arms with their own losses: one series
    # each, so the fleet can average them apart (a gamma label alone mixed them)
    m = WorkerMetrics()
    pol = build_policy(PlannerConfig(ngram_arms=[2, 3]))
    pol.set_priors(PlannerPriors(bucket_edges=[1, 48], entries=[
        {"bucket_lo": 48, "gamma": 2, "mean_loss_s": 0.031, "count": 5},
        {"bucket_lo": 48, "gamma": 2, "mean_loss_s": 0.017, "count": 6, "source": "ngram"},
        {"bucket_lo": 48, "gamma": 0, "mean_loss_s": 0.040, "count": 7},
    ]))
    snap = pol.snapshot()
    assert {(e.bucket_lo, e.gamma, e.source) for e in snap.entries} == {(48, 2, "draft"), (48, 2, "ngram"), (48, 0, "draft")}
    m.set_planner_snapshot(snap)
    assert v("nightjar_planner_loss_seconds", bucket="48", gamma="2", source="draft") == pytest.approx(0.031)
    assert v("nightjar_planner_loss_seconds", bucket="48", gamma="2", source="ngram") == pytest.approx(0.017)
    assert v("nightjar_planner_count", bucket="48", gamma="2", source="ngram") == pytest.approx(6.0)


def test_planner_counts_count_the_policy_increments_and_restart_with_a_new_policy():
    m = WorkerMetrics()
    d0, r0 = (v("nightjar_planner_prior_conflicts_total", action=a) for a in ("dropped", "rescaled"))
    t0 = v("nightjar_planner_ttft_deferrals_total")
    m.observe_planner_counts(PlannerStats(priors_dropped=2))
    m.observe_planner_counts(PlannerStats(priors_dropped=3, prior_rescales=1, ttft_deferrals=5))
    m.observe_planner_counts(PlannerStats(priors_dropped=1, ttft_deferrals=2))  # a rebuilt policy counts from 0
    assert v("nightjar_planner_ttft_deferrals_total") - t0 == 7
    assert v("nightjar_planner_prior_conflicts_total", action="dropped") - d0 == 4
    assert v("nightjar_planner_prior_conflicts_total", action="rescaled") - r0 == 1


def test_draft_state_enum_and_transitions():
    m = WorkerMetrics()
    t0 = v("nightjar_draft_transitions_total", **{"from": "resident", "to": "offloading"})
    m.draft_state_changed("resident", "offloading")
    assert v("nightjar_draft_state") == 1
    assert v("nightjar_draft_state_info", state="offloading") == 1
    assert v("nightjar_draft_state_info", state="resident") == 0
    assert v("nightjar_draft_transitions_total", **{"from": "resident", "to": "offloading"}) == t0 + 1
    with pytest.raises(ValueError, match="draft state"):
        m.draft_state_changed("offloading", "vanished")


def test_draft_returns_by_trigger_exist_from_the_start():
    from prometheus_client import REGISTRY

    m = WorkerMetrics()
    m.draft_state_changed(None, "resident")
    for tr in ("demand", "recheck", "pinned"):  # rate() of the dashboard reads 0, not "no data"
        assert REGISTRY.get_sample_value("nightjar_draft_returns_total", {"trigger": tr}) is not None
    r0 = v("nightjar_draft_returns_total", trigger="recheck")
    m.observe_return("recheck")
    assert v("nightjar_draft_returns_total", trigger="recheck") == r0 + 1


def test_metrics_recorded_in_another_process_are_served_here(tmp_path):
    """The mechanism /metrics relies on: PROMETHEUS_MULTIPROC_DIR shared by EngineCore and API server."""
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    child = textwrap.dedent("""
        from nightjar_worker.metrics import worker_metrics
        m = worker_metrics()
        for g in (0, 4, 4):
            m.observe_step(g, 8, num_draft_tokens=4 * 8 * (g > 0), num_accepted_tokens=3 * 8 * (g > 0))
        m.set_planner_snapshot({(8, 4): (0.004, 2.0)})
    """)
    subprocess.run([sys.executable, "-c", child], env=env, check=True, timeout=60)
    server = textwrap.dedent("""
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess
        reg = CollectorRegistry()
        multiprocess.MultiProcessCollector(reg)
        print(generate_latest(reg).decode())
    """)
    out = subprocess.run([sys.executable, "-c", server], env=env, check=True, timeout=60, capture_output=True,
                         text=True).stdout
    assert 'nightjar_steps_total{gamma="4",source="draft"} 2.0' in out
    assert "nightjar_gamma_chosen_count 3.0" in out
    assert 'nightjar_planner_loss_seconds{bucket="8",gamma="4",source="draft"} 0.004' in out
    assert "nightjar_gamma_current 4.0" in out  # mostrecent gauge, no pid label
