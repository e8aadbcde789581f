"""Runtime config: validation, the file watcher (valid update applied, malformed rejected), apply."""

from __future__ import annotations

import json
import logging

import pytest
from nightjar_contract.runtime import (
    RuntimeConfigError,
    WorkerRuntimeConfig,
    parse_runtime_config,
    parse_runtime_config_text,
)
from nightjar_worker.planner import PlannerConfig, build_policy
from nightjar_worker.runtime_config import (
    RuntimeConfigWatcher,
    apply_to_policy,
    check_live_update,
    read_status,
    write_config_atomically,
)
from prometheus_client import REGISTRY


def _failures() -> float:
    return REGISTRY.get_sample_value("nightjar_config_reload_failures_total") or 0.0


def _reloads() -> float:
    return REGISTRY.get_sample_value("nightjar_config_reloads_total") or 0.0


PRIORS = {
    "bucket_edges": [1, 4, 16],
    "entries": [
        {"bucket_lo": 1, "gamma": 0, "mean_loss_s": 0.030, "count": 5},
        {"bucket_lo": 1, "gamma": 3, "mean_loss_s": 0.012, "count": 5},
    ],
}


@pytest.mark.parametrize(
    "doc, field",
    [
        ({"planner": {"max_gamma": -1}}, "planner.max_gamma"),
        ({"planner": {"policy": "magic"}}, "planner.policy"),
        ({"slo": {"tpot_p95_ms": 0}}, "slo.tpot_p95_ms"),
        ({"slo": {"tpot_ms": 30}}, "slo.tpot_ms"),
        ({"priors": {"bucket_edges": [1, 4], "entries": [{"bucket_lo": 2, "gamma": 1, "mean_loss_s": 0.1}]}},
         "priors"),
        ({"planer": {}}, "planer"),
    ],
)
def test_invalid_documents_name_the_field(doc, field):
    with pytest.raises(RuntimeConfigError) as e:
        parse_runtime_config(doc)
    assert field in str(e.value)


def test_yaml_and_json_parse_to_the_same_model():
    doc = {"planner": {"max_gamma": 3}, "slo": {"tpot_p95_ms": 50}, "priors": PRIORS}
    a = parse_runtime_config_text(json.dumps(doc))
    import yaml

    b = parse_runtime_config_text(yaml.safe_dump(doc))
    assert a == b and a.tpot_target_s() == 0.05
    with pytest.raises(RuntimeConfigError, match="YAML"):
        parse_runtime_config_text("planner: [unclosed")


def test_live_update_refuses_engine_shaping_fields():
    old = WorkerRuntimeConfig()
    check_live_update(old, WorkerRuntimeConfig(slo={"tpot_p95_ms": 40}))  # fine
    with pytest.raises(RuntimeConfigError, match="planner.max_gamma"):
        check_live_update(old, WorkerRuntimeConfig(planner=PlannerConfig(max_gamma=2)))


def test_apply_sets_slo_and_knobs_on_a_real_policy():
    policy = build_policy(PlannerConfig())
    new = WorkerRuntimeConfig(slo={"tpot_p95_ms": 40}, priors=PRIORS)
    applied = apply_to_policy(policy, None, new)
    assert any("slo" in a for a in applied)
    assert any("priors" in a for a in applied)


def test_watcher_applies_valid_and_rejects_malformed(tmp_path, caplog):
    path = tmp_path / "nightjar.yaml"
    state = tmp_path / "state"
    write_config_atomically(path, WorkerRuntimeConfig())
    seen: list[WorkerRuntimeConfig] = []
    w = RuntimeConfigWatcher(path, lambda new, old: seen.append(new), interval_s=0.05, state_dir=str(state))
    w.load_initial()
    assert len(seen) == 1 and read_status(str(state))["applied_digest"] == WorkerRuntimeConfig().digest()
    assert not w.check()  # unchanged file: nothing applied

    # valid update -> applied, reload counted, status file updated
    r0 = _reloads()
    good = WorkerRuntimeConfig(slo={"tpot_p95_ms": 25}, planner=PlannerConfig(explore_scale=0.5))
    write_config_atomically(path, good)
    assert w.check()
    assert w.current == good and seen[-1] == good and _reloads() == r0 + 1
    assert read_status(str(state))["applied_digest"] == good.digest()

    # malformed update -> rejected, old config kept, failure metric + clear log naming the field
    f0 = _failures()
    path.write_text("planner:\n  max_gamma: -3\n")
    with caplog.at_level(logging.ERROR, logger="nightjar.runtime_config"):
        assert not w.check()
    assert w.current == good and len(seen) == 2
    assert _failures() == f0 + 1
    assert "planner.max_gamma" in caplog.text and "keeping the previous" in caplog.text
    assert "planner.max_gamma" in read_status(str(state))["last_error"]
    assert not w.check()  # reported once, not on every poll

    # a change needing a restart is rejected the same way
    write_config_atomically(path, WorkerRuntimeConfig(planner=PlannerConfig(max_gamma=2)))
    assert not w.check() and w.current == good and _failures() == f0 + 2

    # an on_update failure also keeps the old config
    def boom(new, old):
        raise ValueError("priors: policy refused them")

    w.on_update = boom
    write_config_atomically(path, WorkerRuntimeConfig(slo={"tpot_p95_ms": 99}))
    assert not w.check() and w.current == good and _failures() == f0 + 3


def test_watcher_thread_picks_up_changes(tmp_path):
    import time

    path = tmp_path / "c.yaml"
    write_config_atomically(path, WorkerRuntimeConfig())
    seen = []
    w = RuntimeConfigWatcher(path, lambda new, old: seen.append(new), interval_s=0.05, state_dir="")
    w.load_initial()
    w.start()
    try:
        write_config_atomically(path, WorkerRuntimeConfig(slo={"ttft_p95_ms": 500}))
        deadline = time.monotonic() + 5
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        w.stop()
    assert len(seen) == 2 and seen[-1].slo.ttft_p95_ms == 500


def test_initial_malformed_file_fails_start(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("slo: {tpot_p95_ms: -1}\n")
    w = RuntimeConfigWatcher(path, lambda new, old: None, state_dir="")
    with pytest.raises(RuntimeConfigError, match="slo.tpot_p95_ms"):
        w.load_initial()


def test_applied_priors_show_in_the_policy_snapshot():
    policy = build_policy(PlannerConfig())
    apply_to_policy(policy, None, WorkerRuntimeConfig(priors=PRIORS))
    snap = {(e.bucket_lo, e.gamma): e.mean_loss_s for e in policy.snapshot().entries}
    assert snap[(1, 3)] == pytest.approx(0.012) and snap[(1, 0)] == pytest.approx(0.030)


def test_policy_holder_rebuilds_on_policy_change_and_keeps_state_otherwise(tmp_path):
    from nightjar_worker.runtime_config import PolicyHolder

    holder = PolicyHolder(WorkerRuntimeConfig())
    first = holder.policy
    holder.update(WorkerRuntimeConfig(slo={"tpot_p95_ms": 30}))
    assert holder.policy is first  # knobs/SLO: same (learned) policy object
    holder.update(WorkerRuntimeConfig(planner=PlannerConfig(policy="static", static_gamma=2)))
    assert holder.policy is not first and holder.policy.decide(8) == 2
    # through the watcher: an invalid combination is rejected and the old policy stays
    path = tmp_path / "c.yaml"
    write_config_atomically(path, holder.config)
    w = RuntimeConfigWatcher(path, holder, state_dir="")
    w.load_initial()
    path.write_text("planner: {policy: dsd}\n")  # dsd needs a cost profile
    assert not w.check() and holder.policy.decide(8) == 2


def test_engine_control_records_metrics_and_applies_updates(tmp_path, monkeypatch):
    from nightjar_worker.engine.control import EngineControl
    from nightjar_worker.planner.policy import StepFeedback

    monkeypatch.delenv("NIGHTJAR_FORCE_GAMMA", raising=False)
    path = tmp_path / "c.yaml"
    write_config_atomically(path, WorkerRuntimeConfig(priors=PRIORS))
    ctl = EngineControl(4, config_path=path, poll_s=0, snapshot_every_s=3600.0)
    steps0 = sum(REGISTRY.get_sample_value("nightjar_steps_total", {"gamma": str(g), "source": "draft"}) or 0 for g in range(5))
    for i in range(20):
        g, _ = ctl.decide(1)
        ctl.observe(StepFeedback(step=i, batch_size=1, num_reqs=1, gamma=g, step_time_s=0.01, tokens_emitted=1 + g,
                              num_draft_tokens=g, num_accepted_tokens=g))
    steps1 = sum(REGISTRY.get_sample_value("nightjar_steps_total", {"gamma": str(g), "source": "draft"}) or 0 for g in range(5))
    assert steps1 - steps0 == 20
    # the first step exported the estimates even though the next export is an hour away
    assert REGISTRY.get_sample_value("nightjar_planner_loss_seconds", {"bucket": "1", "gamma": "0", "source": "draft"}) is not None
    assert REGISTRY.get_sample_value("nightjar_planner_acceptance_gate_closed") == 0  # every draft accepted
    assert REGISTRY.get_sample_value("nightjar_planner_draft_prefill_seconds") == 0  # no prompt seen: not learnt
    # an update is exported at once, without waiting for a step or the period
    fresh = {"bucket_lo": 16, "gamma": 2, "mean_loss_s": 0.0456, "count": 3}  # a bucket no step reached
    write_config_atomically(path, WorkerRuntimeConfig(
        priors=PRIORS | {"entries": [*PRIORS["entries"], fresh], "draft_prefill_s_per_token": 0.0063}))
    assert ctl.watcher.check()
    got = REGISTRY.get_sample_value("nightjar_planner_loss_seconds", {"bucket": "16", "gamma": "2", "source": "draft"})
    assert got == pytest.approx(0.0456)
    # the draft's prefill price the planner holds (the priors' until it learns its own), for the fleet
    got = REGISTRY.get_sample_value("nightjar_planner_draft_prefill_per_prompt_token_seconds")
    assert got == pytest.approx(0.0063)
    write_config_atomically(path, WorkerRuntimeConfig(planner=PlannerConfig(policy="static", static_gamma=1)))
    assert ctl.watcher.check() and ctl.decide(4)[0] == 1
    ctl.close()


def test_engine_control_tells_the_memory_manager_what_the_policy_wants_of_the_draft(tmp_path, monkeypatch):
    from nightjar_worker.engine.control import EngineControl

    monkeypatch.delenv("NIGHTJAR_FORCE_GAMMA", raising=False)
    path = tmp_path / "c.yaml"
    write_config_atomically(path, WorkerRuntimeConfig(planner=PlannerConfig(policy="static", static_gamma=2)))
    ctl = EngineControl(4, config_path=path, poll_s=0, snapshot_every_s=3600.0)
    g, _ = ctl.decide(1)
    ctl.set_draft_available(False)
    assert ctl.draft_demand(g, 1) == 2  # a policy that is not told keeps choosing the draft (clamped)
    write_config_atomically(path, WorkerRuntimeConfig(
        planner=PlannerConfig(policy="static", static_gamma=2, static_source="ngram")))
    assert ctl.watcher.check()
    g, _ = ctl.decide(1)
    assert (g, ctl.source, ctl.draft_demand(g, 1)) == (2, "ngram", 0)
    write_config_atomically(path, WorkerRuntimeConfig(planner=PlannerConfig(ngram_arms=[1, 2])))
    assert ctl.watcher.check()
    ctl.set_draft_available(False)  # Nightjar is told: no draft arm is played, its demand is its own
    for _ in range(50):
        g, _ = ctl.decide(1)
        assert ctl.source == "ngram" or g == 0
        assert ctl.draft_demand(g, 1) == ctl.policy.draft_demand(1)
    ctl.close()


def test_adding_suffix_arms_live_rebuilds_the_policy_with_them(tmp_path, monkeypatch):
    # new arms are a new policy (the bandit's arm set is fixed for its life); the suffix source is
    # then played while the draft is away, like prompt lookup
    from nightjar_worker.engine.control import EngineControl

    monkeypatch.delenv("NIGHTJAR_FORCE_GAMMA", raising=False)
    path = tmp_path / "c.yaml"
    write_config_atomically(path, WorkerRuntimeConfig(planner=PlannerConfig(ngram_arms=[1, 2])))
    ctl = EngineControl(4, config_path=path, poll_s=0, snapshot_every_s=3600.0)
    write_config_atomically(path, WorkerRuntimeConfig(planner=PlannerConfig(ngram_arms=[1, 2], suffix_arms=[2, 3])))
    assert ctl.watcher.check()
    assert ("suffix", 3) in ctl.policy.armset.keys
    ctl.set_draft_available(False)
    seen = set()
    for _ in range(200):
        g, _ = ctl.decide(1)
        seen.add(ctl.source if g else "none")
    assert "suffix" in seen and "draft" not in seen
    ctl.close()


def test_engine_control_counts_prior_conflicts(tmp_path, monkeypatch):
    # A worker twice as slow as its priors on every arm: the planner rescales them to its level
    # (nightjar_planner_prior_conflicts_total{action="rescaled"}), after dropping the first arm tried.
    from nightjar_worker.engine.control import EngineControl
    from nightjar_worker.planner.policy import StepFeedback

    monkeypatch.delenv("NIGHTJAR_FORCE_GAMMA", raising=False)
    loss = {0: 0.049, 1: 0.058, 2: 0.065, 3: 0.073, 4: 0.082}
    priors = {"bucket_edges": [1, 16], "entries": [
        {"bucket_lo": 16, "gamma": g, "mean_loss_s": m, "count": 16} for g, m in loss.items()]}
    path = tmp_path / "c.yaml"
    write_config_atomically(path, WorkerRuntimeConfig(priors=priors))
    ctl = EngineControl(4, config_path=path, poll_s=0, snapshot_every_s=3600.0)
    c0 = {a: REGISTRY.get_sample_value("nightjar_planner_prior_conflicts_total", {"action": a}) or 0.0
          for a in ("dropped", "rescaled")}
    for i in range(300):
        g, _ = ctl.decide(16)
        tokens = 16 + 8 * g  # half of the drafts accepted
        ctl.observe(StepFeedback(step=i, batch_size=16, num_reqs=16, gamma=g, step_time_s=2 * loss[g] * tokens * (1 + 0.02 * (i % 3 - 1)),
                              tokens_emitted=tokens, num_draft_tokens=16 * g, num_accepted_tokens=8 * g))
    stats = ctl.policy.stats
    assert stats.prior_rescales >= 1
    for action, n in (("dropped", stats.priors_dropped), ("rescaled", stats.prior_rescales)):
        got = REGISTRY.get_sample_value("nightjar_planner_prior_conflicts_total", {"action": action})
        assert got - c0[action] == n
    ctl.close()


def test_engine_control_tells_the_queue_only_to_a_policy_that_prices_it(tmp_path, monkeypatch):
    from nightjar_worker.engine.control import EngineControl
    from nightjar_worker.planner.policy import QueuedPrompt

    monkeypatch.delenv("NIGHTJAR_FORCE_GAMMA", raising=False)
    path = tmp_path / "c.yaml"
    write_config_atomically(path, WorkerRuntimeConfig(priors=PRIORS))
    ctl = EngineControl(4, config_path=path, poll_s=0, snapshot_every_s=3600.0)
    queue = (QueuedPrompt(0.5, 0), QueuedPrompt(0.1, 1))
    assert not ctl.wants_queue()  # Nightjar's planner without a TTFT target: the per-token objective
    ctl.policy.set_slo(None, ttft_s=1.0)
    assert ctl.wants_queue()  # the scheduler walks the queue for it
    ctl.decide(4, 300, queue)
    assert ctl.policy.objective.queue == queue
    write_config_atomically(path, WorkerRuntimeConfig(planner=PlannerConfig(policy="static", static_gamma=1)))
    assert ctl.watcher.check() and not ctl.wants_queue()  # the scheduler then walks one step only
    assert ctl.decide(4, 300, queue)[0] == 1
    ctl.close()
