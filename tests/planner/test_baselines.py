"""The baselines behind the same GammaPolicy interface."""

from __future__ import annotations

import random

import pytest
from nightjar_worker.planner import PlannerConfig, StepFeedback, build_policy
from nightjar_worker.planner.dsd import invert_acceptance
from nightjar_worker.planner.oracle import OraclePolicy
from nightjar_worker.planner.policy import GammaPolicy
from nightjar_worker.planner.static import StaticPolicy
from nightjar_worker.sim.profile import expected_tokens
from planner_env import run_env


def test_nosd_never_speculates():
    pol = build_policy(PlannerConfig(policy="nosd"))
    assert isinstance(pol, GammaPolicy)
    assert {pol.decide(b) for b in (1, 10, 300)} == {0}


def test_static():
    pol = build_policy(PlannerConfig(policy="static", static_gamma=2))
    assert {pol.decide(b) for b in (1, 10, 300)} == {2}
    assert build_policy(PlannerConfig(policy="static")).decide(1) == 4  # default K
    with pytest.raises(ValueError, match="static_gamma"):
        StaticPolicy(-1)


def test_table_semantics():
    # vLLM num_speculative_tokens_per_batch_size: the largest key <= batch; below the smallest key,
    # the smallest key's value.
    pol = build_policy(PlannerConfig(policy="table", gamma_table={4: 3, 16: 2, 64: 0}))
    assert [pol.decide(b) for b in (1, 4, 5, 15, 16, 63, 64, 1000)] == [3, 3, 3, 3, 2, 2, 0, 0]


def test_dsd_follows_profile_and_acceptance(roofline):
    pol = build_policy(PlannerConfig(policy="dsd"), roofline)
    small, large = pol.decide(1), pol.decide(256)
    assert small >= 2 and large == 0
    # Feed near-zero acceptance: speculation stops paying even at batch 1.
    for _ in range(200):
        pol.observe(StepFeedback(batch_size=1, gamma=4, step_time_s=0.01, tokens_emitted=1,
                                 num_draft_tokens=4, num_accepted_tokens=0))
    assert pol.alpha < 0.05
    assert pol.decide(1) == 0


def test_invert_acceptance():
    for a in (0.1, 0.5, 0.8):
        assert abs(invert_acceptance(expected_tokens(4, a) - 1.0, 4) - a) < 1e-6
    assert invert_acceptance(0.0, 3) == 0.0 and invert_acceptance(3.0, 3) == 1.0


def test_ucb_tries_every_arm_then_converges():
    pol = build_policy(PlannerConfig(policy="ucb"))
    losses = {4: {0: 1e-3, 1: 0.8e-3, 2: 0.5e-3, 3: 0.7e-3, 4: 0.9e-3}}
    chosen = run_env(pol, losses, [4] * 3000)
    assert set(chosen[:5]) == {0, 1, 2, 3, 4}
    assert chosen[-500:].count(2) >= 400


def test_oracle_is_argmin_of_true_loss(roofline):
    cfg = PlannerConfig(policy="oracle")
    pol = build_policy(cfg, roofline)
    assert isinstance(pol, OraclePolicy)
    for b in (1, 8, 64, 128, 256):
        best = min(pol.arms, key=lambda g: pol.expected_loss(b, g))
        fresh = OraclePolicy(cfg, roofline)
        fresh._last = best  # no switching in the way
        assert fresh.decide(b) == best
    assert pol.decide(1) > 0 and OraclePolicy(cfg, roofline).decide(256) == 0


def test_oracle_charges_the_draft_prefill_to_speculation(roofline):
    cfg = PlannerConfig(policy="oracle")
    plain = OraclePolicy(cfg, roofline)
    g = plain.decide(1)
    assert g > 0
    gain = plain.expected_loss(1, 0) - plain.expected_loss(1, g)
    # the draft's prefill of 3 prompt tokens per generated token, each costing 1.5x the gain / 3
    heavy = roofline.model_copy(update={"draft_prefill_s_per_token": 0.5 * gain, "prompt_tokens_per_output_token": 3.0})
    pol = OraclePolicy(cfg, heavy)
    assert pol.expected_loss(1, g) == pytest.approx(plain.expected_loss(1, g) + 1.5 * gain)
    assert pol.expected_loss(1, 0) == plain.expected_loss(1, 0)
    assert pol.decide(1) == 0


def test_oracle_charges_switching(roofline):
    pol = OraclePolicy(PlannerConfig(policy="oracle"), roofline)
    # A long time off at batch 64 makes the catch-up expensive: stay off even though gamma 1 is
    # cheaper per token in steady state.
    rng = random.Random(0)
    for _ in range(2000):
        g = pol.decide(256)
        pol.observe(StepFeedback(batch_size=256, gamma=g, step_time_s=0.012, tokens_emitted=256))
    assert pol.decide(64) == 0 or pol.expected_loss(64, 0) <= pol.expected_loss(64, 1) * 1.5
    del rng
