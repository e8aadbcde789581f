import pytest
from nightjar_contract.memory import OffloadPolicyConfig
from nightjar_worker.memory.offload_policy import Action, MemoryView, OffloadPolicy
from nightjar_worker.memory.offload_state import DraftState
from pydantic import ValidationError


def view(gamma=0, waiting=0, used=10, allowed=100, base=100, gain=None, reload=0.0, switch=0.0):
    return MemoryView(
        planner_gamma=gamma, batch_size=8, num_waiting=waiting, used_blocks=used,
        allowed_blocks=allowed, base_blocks=base, spec_gain_s=gain, reload_cost_s=reload,
        switch_cost_s=switch,
    )


# recheck_after_s off: these tests are about the planner's demand
CFG = OffloadPolicyConfig(offload_after_steps=3, reload_after_steps=4, min_resident_s=0, min_offloaded_s=0,
                          recheck_after_s=None)


def run(policy, v, state, n, t=100.0, **kw):
    return [policy.decide(v, state, t, **kw) for _ in range(n)]


def test_offload_needs_gamma_zero_and_pressure_for_k_steps():
    p = OffloadPolicy(CFG)
    assert run(p, view(gamma=0, waiting=4), DraftState.RESIDENT, 3) == [Action.NONE] * 2 + [Action.OFFLOAD]
    # gamma 0 without pressure: the draft stays.
    p = OffloadPolicy(CFG)
    assert set(run(p, view(gamma=0, waiting=0, used=10), DraftState.RESIDENT, 20)) == {Action.NONE}
    # pressure but the planner still speculates: the draft stays.
    p = OffloadPolicy(CFG)
    assert set(run(p, view(gamma=2, waiting=5), DraftState.RESIDENT, 20)) == {Action.NONE}
    # KV usage above the high mark is pressure too.
    p = OffloadPolicy(CFG)
    assert run(p, view(gamma=0, used=95), DraftState.RESIDENT, 3)[-1] is Action.OFFLOAD


def test_interrupted_streak_restarts_the_count():
    p = OffloadPolicy(CFG)
    s = DraftState.RESIDENT
    assert p.decide(view(waiting=4), s, 100) is Action.NONE
    assert p.decide(view(waiting=4), s, 100) is Action.NONE
    assert p.decide(view(waiting=0), s, 100) is Action.NONE  # streak broken
    assert run(p, view(waiting=4), s, 3) == [Action.NONE, Action.NONE, Action.OFFLOAD]


def test_min_dwell_time():
    p = OffloadPolicy(OffloadPolicyConfig(offload_after_steps=1, min_resident_s=5))
    assert p.decide(view(waiting=4), DraftState.RESIDENT, 1.0) is Action.NONE
    assert p.decide(view(waiting=4), DraftState.RESIDENT, 6.0) is Action.OFFLOAD


def test_reload_when_calm_and_speculation_pays():
    p = OffloadPolicy(CFG)
    s = DraftState.OFFLOADED
    calm = view(gamma=3, used=50, allowed=130, base=100)
    assert run(p, calm, s, 4) == [Action.NONE] * 3 + [Action.DRAIN]
    # blocks in use do not fit in the base pool's low mark: wait.
    p = OffloadPolicy(CFG)
    assert set(run(p, view(gamma=3, used=90, allowed=130, base=100), s, 20)) == {Action.NONE}
    # waiting requests: stay offloaded.
    p = OffloadPolicy(CFG)
    assert set(run(p, view(gamma=3, waiting=1, used=5, allowed=130), s, 20)) == {Action.NONE}
    # the planner still wants gamma 0: stay offloaded.
    p = OffloadPolicy(CFG)
    assert set(run(p, view(gamma=0, used=5, allowed=130), s, 20)) == {Action.NONE}


def test_recheck_brings_the_draft_back_when_calm_without_demand():
    """The planner wants no draft (gamma 0 or another source) but the draft has been away
    ``recheck_after_s`` with the KV cache calm: it returns, once, as a recheck."""
    cfg = CFG.model_copy(update={"recheck_after_s": 30.0})
    s = DraftState.OFFLOADED
    calm = view(gamma=0, used=50, allowed=130, base=100)
    p = OffloadPolicy(cfg)
    assert set(run(p, calm, s, 20, t=10.0)) == {Action.NONE}  # too soon
    assert run(p, calm, s, 1, t=31.0) == [Action.DRAIN] and p.trigger == "recheck"
    # calm steps are counted afresh after the dwell; pressure or a full base pool breaks them
    p = OffloadPolicy(cfg)
    assert set(run(p, view(gamma=0, used=90, allowed=130, base=100), s, 20, t=60.0)) == {Action.NONE}
    assert set(run(p, view(gamma=0, waiting=1, used=10, allowed=130, base=100), s, 20, t=60.0)) == {Action.NONE}
    assert run(p, calm, s, 4, t=60.0) == [Action.NONE] * 3 + [Action.DRAIN]
    # the planner's own demand comes first and says so; None turns rechecks off
    p = OffloadPolicy(cfg)
    assert run(p, view(gamma=3, used=50, allowed=130, base=100), s, 4, t=60.0)[-1] is Action.DRAIN
    assert p.trigger == "demand"
    p = OffloadPolicy(cfg.model_copy(update={"recheck_after_s": None}))
    assert set(run(p, calm, s, 50, t=1e6)) == {Action.NONE}


def test_reload_cost_and_switch_cost_are_charged():
    p = OffloadPolicy(CFG)  # amortize over 200 steps
    s = DraftState.OFFLOADED
    # 1 ms/step saving * 200 = 0.2 s < 0.15 + 0.1 s of reload + C_switch: not worth it.
    assert set(run(p, view(gamma=2, gain=0.001, reload=0.15, switch=0.1), s, 20)) == {Action.NONE}
    assert run(p, view(gamma=2, gain=0.002, reload=0.15, switch=0.1), s, 4)[-1] is Action.DRAIN


def test_backoff_blocks_reload():
    p = OffloadPolicy(CFG)
    calm = view(gamma=3, used=5, allowed=130)
    assert set(run(p, calm, DraftState.OFFLOADED, 10, retry_allowed=False)) == {Action.NONE}
    assert p.decide(calm, DraftState.OFFLOADED, 100, retry_allowed=True) is Action.DRAIN


def test_drain_cancelled_when_pressure_returns():
    p = OffloadPolicy(CFG)
    s = DraftState.DRAINING
    assert run(p, view(gamma=0, waiting=3), s, 3) == [Action.NONE, Action.NONE, Action.CANCEL_DRAIN]
    p = OffloadPolicy(CFG)
    assert set(run(p, view(gamma=2, used=20), s, 20)) == {Action.NONE}


def test_reload_cancelled_when_pressure_returns():
    p = OffloadPolicy(CFG)
    s = DraftState.RELOADING
    assert run(p, view(gamma=0, waiting=3), s, 3) == [Action.NONE, Action.NONE, Action.CANCEL_RELOAD]
    p = OffloadPolicy(CFG)
    assert set(run(p, view(gamma=2, used=20), s, 20)) == {Action.NONE}  # calm: the reload goes on


def test_disabled_never_acts():
    p = OffloadPolicy(OffloadPolicyConfig(enabled=False, offload_after_steps=1, min_resident_s=0))
    assert set(run(p, view(waiting=9), DraftState.RESIDENT, 10)) == {Action.NONE}


def test_bad_config_names_the_field():
    with pytest.raises(ValidationError, match="kv_usage_low"):
        OffloadPolicyConfig(kv_usage_low=0.95, kv_usage_high=0.9)
    with pytest.raises(ValidationError, match="offload_after_steps"):
        OffloadPolicyConfig(offload_after_steps=0)
    with pytest.raises(ValidationError, match="bogus"):
        OffloadPolicyConfig(bogus=1)


def _planner_at_batch_4(l0: float, l2: float):
    """A Nightjar planner that has seen gamma 0 and gamma 2 at batch 4 (``l0``/``l2`` seconds per
    token), one resume whose catch-up took 0.3 s after 100 steps off, then 100 steps off again (the
    draft offloaded: the engine plays gamma 0 whatever the planner wants)."""
    from nightjar_contract.planner import PlannerConfig
    from nightjar_worker.planner.nightjar import NightjarPolicy
    from nightjar_worker.planner.policy import StepFeedback

    pol = NightjarPolicy(PlannerConfig(arms=[0, 2], max_gamma=2, max_batch=16))
    for _ in range(100):
        pol.observe(StepFeedback(batch_size=4, gamma=0, step_time_s=4 * l0, tokens_emitted=4))
    pol.observe(StepFeedback(batch_size=4, gamma=2, step_time_s=4 * l0, tokens_emitted=4, switch_cost_s=0.3))
    for _ in range(100):
        pol.observe(StepFeedback(batch_size=4, gamma=2, step_time_s=8 * l2, tokens_emitted=8,
                                 num_draft_tokens=8, num_accepted_tokens=4))
    for _ in range(100):
        pol.observe(StepFeedback(batch_size=4, gamma=0, step_time_s=4 * l0, tokens_emitted=4))
    gammas = [pol.decide(4) for _ in range(40)]  # new bins record the bucket's gain
    return pol, gammas[-1]


@pytest.mark.parametrize(("reload_s", "drains"), [(5.0, False), (0.5, True)])
def test_a_reload_waits_until_the_planners_gain_pays_for_it(reload_s, drains):
    # Speculation saves 2 ms per token at batch 4 (8 ms per step): over the 200-step horizon that is
    # 1.6 s, which pays a 0.5 s reload plus the 0.3 s catch-up but not a 5 s reload.
    pol, gamma = _planner_at_batch_4(0.010, 0.008)
    assert gamma == 2
    gain, switch = pol.speculation_gain_s(4), pol.switch_cost_s(4)
    assert gain == pytest.approx(0.008, rel=0.05)
    assert switch == pytest.approx(0.3, rel=0.05)
    p = OffloadPolicy(CFG)
    calm = MemoryView(planner_gamma=gamma, batch_size=4, num_waiting=0, used_blocks=50, allowed_blocks=130,
                      base_blocks=100, spec_gain_s=gain, switch_cost_s=switch, reload_cost_s=reload_s)
    assert (Action.DRAIN in run(p, calm, DraftState.OFFLOADED, 20)) is drains
