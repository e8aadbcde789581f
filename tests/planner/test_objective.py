"""The SLO objective (planner/nightjar/objective.py): when a prompt step or a resume is played without
the draft, and that the policy does so only with a TTFT target, on the simulator's long-prompt workload."""

from __future__ import annotations

from pathlib import Path

import pytest
from nightjar_worker.planner import PlannerConfig, build_policy
from nightjar_worker.planner.nightjar.objective import SloObjective
from nightjar_worker.planner.policy import QueuedPrompt
from nightjar_worker.sim.profile import CostProfile
from nightjar_worker.sim.simulator import Simulator
from nightjar_worker.sim.workload import long_prompt_workload, make_requests

ROOFLINE = Path(__file__).resolve().parents[2] / "benchmarks" / "profiles" / "roofline-h100-7b.json"


def test_defers_a_miss_turned_into_a_hit_or_a_draining_queue():
    o = SloObjective()
    o.configure(ttft_s=0.10, tpot_s=None, attainment=1.0)
    o.observe_step(0.02)  # the wait: the last step
    assert o.defer(0.09, 0.07)  # 0.11 misses, 0.09 meets
    assert not o.defer(0.07, 0.06)  # meets either way
    assert not o.defer(0.12, 0.09)  # misses either way (0.11), no queue
    o.observe_step(0.02, prompt_tokens=300)  # prompt steps back to back: a queue drains
    assert o.defer(0.12, 0.09)  # misses either way: the shorter step serves the queue sooner
    assert not o.defer(0.07, 0.06)
    o.configure(ttft_s=None, tpot_s=0.01, attainment=0.99)
    assert not o.defer(1.0, 0.0)  # no TTFT target: the per-token objective


def test_with_the_queue_told_defers_only_where_a_first_token_is_saved():
    o = SloObjective()
    o.configure(ttft_s=0.10, tpot_s=None, attainment=1.0)
    o.observe_step(0.02, prompt_tokens=300)  # back to back prompt steps: the queueless rule would defer
    # waited 0.02 s, completes this step: 0.02 + 0.09 misses, 0.02 + 0.07 meets
    o.observe_queue((QueuedPrompt(0.02, 0),))
    assert o.defer(0.09, 0.07)
    # overload: every waiting prompt has missed already; deferring saves none, the arm keeps its throughput
    o.observe_queue((QueuedPrompt(0.15, 0), QueuedPrompt(0.12, 1)))
    assert not o.defer(0.12, 0.09)
    # a prompt two steps ahead: 0.01 + 3 x 0.04 misses, 0.01 + 3 x 0.025 meets
    o.observe_queue((QueuedPrompt(0.15, 0), QueuedPrompt(0.01, 2)))
    assert o.defer(0.04, 0.025)
    o.observe_queue(())
    assert not o.defer(0.12, 0.09)  # nothing waits: nothing to save


def test_a_resume_is_deferred_where_its_catch_up_loses_a_first_token():
    """A step that resumes the draft pays C_switch once, ahead of every waiting prompt."""
    o = SloObjective()
    o.configure(ttft_s=0.10, tpot_s=None, attainment=1.0)
    assert o.decode_step_s() is None  # no decode step seen yet
    o.observe_step(0.01)
    assert o.decode_step_s() == pytest.approx((0.01, 0.01))
    # waited 0.05 s, one prompt step ahead: 0.05 + 2 x 0.01 meets; with a 0.04 s catch-up it misses
    o.observe_queue((QueuedPrompt(0.05, 1),))
    assert o.defer(0.01, 0.01, resume_s=0.04, prompted=False)
    assert not o.defer(0.01, 0.01, resume_s=0.02, prompted=False)  # 0.09: meets with the catch-up too
    assert not o.defer(0.01, 0.01, prompted=False)  # no resume: nothing to save
    o.observe_queue(())
    assert not o.defer(0.01, 0.01, resume_s=1.0, prompted=False)  # nothing waits
    untold = SloObjective()
    untold.configure(ttft_s=0.10, tpot_s=None, attainment=1.0)
    untold.observe_step(0.01)
    assert not untold.defer(0.01, 0.01, resume_s=1.0, prompted=False)  # no queue told: no prompt to price


def test_wait_is_the_attainment_quantile_of_the_last_step():
    o = SloObjective()
    o.configure(ttft_s=1.0, tpot_s=None, attainment=0.5)
    o.observe_step(0.4)
    assert o.first_token_s(0.1) == pytest.approx(0.3)


@pytest.mark.parametrize("bad", [{"ttft_s": 0.0}, {"tpot_s": -1.0}, {"attainment": 0.0}, {"attainment": 1.5}])
def test_configure_rejects(bad):
    kw = {"ttft_s": None, "tpot_s": None, "attainment": 0.99} | bad
    with pytest.raises(ValueError, match="slo_"):
        SloObjective().configure(**kw)


def _run(**slo):
    prof = CostProfile.load(ROOFLINE)
    reqs = make_requests([(10.0, 8.0)], 3, long_prompt_workload())
    pol = build_policy(PlannerConfig(max_batch=prof.max_batch, seed=3, **slo), prof)
    res = Simulator(prof, reqs, seed=3).run(pol, measure_from_s=1.0)
    return pol, res


def test_ttft_target_moves_prefill_off_the_draft_and_meets_more_first_tokens():
    ttft = 0.045  # a 600-token prefill step: ~30 ms without the draft, ~37 ms with it, plus the wait
    base_pol, base = _run()
    pol, res = _run(slo_ttft_s=ttft)
    assert base_pol.stats.ttft_deferrals == 0
    assert pol.stats.ttft_deferrals > 5
    hit = res.slo(ttft, None).attainment
    assert hit > base.slo(ttft, None).attainment + 0.05


def test_set_slo_carries_the_ttft_target():
    pol = build_policy(PlannerConfig(slo_attainment=0.9))
    pol.set_slo(0.05, ttft_s=0.5)
    assert (pol.objective.ttft_s, pol.objective.tpot_s, pol.objective.attainment) == (0.5, 0.05, 0.9)
    pol.set_slo(None)
    assert pol.objective.ttft_s is None


def test_prompt_step_lengths_from_the_running_arm_and_the_plain_step():
    o = SloObjective()
    slopes = (1e-3, 1.5e-3)  # target's, target's + draft's seconds per prompt token
    assert o.prompt_step_s(100, slopes, None) is None  # nothing known yet
    assert o.prompt_step_s(100, slopes, 0.2) == pytest.approx((0.25, 0.2))
    o.observe_step(0.3, prompt_tokens=50)  # a prompt step is not the arm's decode step
    assert o.prompt_step_s(100, slopes, 0.2) == pytest.approx((0.25, 0.2))
    o.observe_step(0.04)  # the running arm's decode step
    assert o.prompt_step_s(100, slopes, 0.2) == pytest.approx((0.19, 0.2))
    assert o.prompt_step_s(100, slopes, None) == pytest.approx((0.19, 0.14))


def test_a_tpot_target_alone_changes_no_decision():
    """The least-loss arm is the least-TPOT arm (objective.py): a TPOT target, met or not, leaves
    the per-token planner's decisions as they are."""
    prof = CostProfile.load(ROOFLINE)
    reqs = make_requests([(4.0, 8.0)], 1, long_prompt_workload())
    logs = []
    for slo in ({}, {"slo_tpot_s": 0.004}, {"slo_tpot_s": 1.0}):
        pol = build_policy(PlannerConfig(max_batch=prof.max_batch, seed=1, **slo), prof)
        logs.append(Simulator(prof, reqs, seed=1, record_steps=True).run(pol).step_log)
    assert logs[0] == logs[1] == logs[2]


def test_runtime_config_slo_reaches_the_objective():
    """The operator's spec.slo (runtime config ``slo``) sets both targets, as the TPOT cap before."""
    from nightjar_contract.runtime import parse_runtime_config
    from nightjar_worker.runtime_config import apply_to_policy

    pol = build_policy(PlannerConfig())
    new = parse_runtime_config({"slo": {"ttft_p95_ms": 800, "tpot_p95_ms": 60, "attainment": 0.95}})
    apply_to_policy(pol, None, new)
    assert (pol.objective.ttft_s, pol.objective.tpot_s, pol.slo_tpot_s) == (0.8, 0.06, 0.06)
    assert pol.objective.attainment == 0.95
    newer = parse_runtime_config({"slo": {"tpot_p95_ms": 60}, "planner": {"slo_ttft_s": 1.5}})
    apply_to_policy(pol, new, newer)
    assert pol.objective.ttft_s == 1.5
