"""The rollout state machine."""

from __future__ import annotations

from nightjar_operator.fleet.rollout import (
    Analysis,
    Gate,
    Revision,
    RolloutState,
    plan,
    restart_window,
    revision_of,
    split_replicas,
)

STEPS = [25, 50, 100]
W = 60.0
GATE = Gate(objective=0.95, min_requests=5)


def rev(name: str) -> Revision:
    pair = {"target": {"name": "t"}, "draft": {"name": name}}
    return Revision(revision=revision_of(pair), pair=pair, label=f"t/{name}")


def good() -> Analysis:
    return Analysis(0.99, 0.98, 100.0, 100.0, 50, 150)


def bad_slo() -> Analysis:
    return Analysis(0.60, 0.99, 100.0, 100.0, 50, 150)


def test_revision_is_stable_and_distinct():
    assert rev("a").revision == rev("a").revision != rev("b").revision
    assert len(rev("a").revision) == 8


def test_split_replicas():
    assert split_replicas(4, 0) == (4, 0)
    assert split_replicas(4, 25) == (3, 1)
    assert split_replicas(4, 50) == (2, 2)
    assert split_replicas(4, 100) == (0, 4)
    assert split_replicas(1, 10) == (1, 1)  # both revisions keep a replica until 100%
    assert split_replicas(10, 90) == (1, 9)


def start(now=0.0):
    p0 = plan(None, rev("a"), 4, STEPS, W, now, None, GATE)
    assert p0.state.stable.revision == rev("a").revision and p0.candidate_replicas == 0
    p1 = plan(p0.state, rev("b"), 4, STEPS, W, now + 1, None, GATE)
    assert p1.state.phase == "Progressing" and (p1.stable_replicas, p1.candidate_replicas) == (3, 1)
    assert p1.events[0][1] == "RolloutStarted"
    return p1.state


def test_good_candidate_is_promoted_step_by_step():
    s = start()
    # inside the window: no decision even with data
    p = plan(s, rev("b"), 4, STEPS, W, 30.0, good(), GATE)
    assert p.state.step == 0 and not p.events
    p = plan(p.state, rev("b"), 4, STEPS, W, 62.0, good(), GATE)
    assert p.state.step == 1 and p.state.weight == 50 and (p.stable_replicas, p.candidate_replicas) == (2, 2)
    assert p.events[0][1] == "RolloutAdvanced"
    p = plan(p.state, rev("b"), 4, STEPS, W, 123.0, good(), GATE)
    assert p.state.weight == 100 and (p.stable_replicas, p.candidate_replicas) == (0, 4)
    # at 100% there is no stable traffic: judged on the objective alone
    p = plan(p.state, rev("b"), 4, STEPS, W, 184.0, Analysis(0.99, None, 90.0, None, 40, 0), GATE)
    assert p.state.phase == "Stable" and p.state.candidate is None
    assert p.state.stable.revision == rev("b").revision
    assert p.state.last_decision.action == "Promoted" and p.events[0][1] == "RolloutPromoted"
    assert (p.stable_replicas, p.candidate_replicas) == (4, 0)


def test_bad_candidate_is_rolled_back_and_not_retried():
    s = start()
    p = plan(s, rev("b"), 4, STEPS, W, 62.0, bad_slo(), GATE)
    assert p.state.phase == "RolledBack" and p.state.candidate is None
    assert p.state.stable.revision == rev("a").revision and p.state.failed_revision == rev("b").revision
    assert "attainment 0.600" in p.state.last_decision.reason and p.events[0][0] == "Warning"
    assert (p.stable_replicas, p.candidate_replicas) == (4, 0)
    # level-based: the same spec does not start the failed candidate again
    p2 = plan(p.state, rev("b"), 4, STEPS, W, 100.0, None, GATE)
    assert p2.state.candidate is None and p2.candidate_replicas == 0 and not p2.events
    # a different pair does
    p3 = plan(p2.state, rev("c"), 4, STEPS, W, 101.0, None, GATE)
    assert p3.state.candidate.revision == rev("c").revision


def test_throughput_regression_rolls_back():
    s = start()
    # Below saturation the per-pod throughput is the offered load: not a verdict on the candidate.
    p = plan(s, rev("b"), 4, STEPS, W, 62.0, Analysis(0.99, 0.99, 70.0, 100.0, 50, 150), GATE)
    assert p.state.phase == "Progressing" and p.state.step == 1
    p = plan(s, rev("b"), 4, STEPS, W, 62.0, Analysis(0.99, 0.99, 70.0, 100.0, 50, 150, True, True), GATE)
    assert p.state.phase == "RolledBack" and "throughput" in p.state.last_decision.reason


def test_candidate_not_blamed_when_stable_also_misses():
    s = start()
    p = plan(s, rev("b"), 4, STEPS, W, 62.0, Analysis(0.80, 0.81, 100.0, 100.0, 50, 150), GATE)
    assert p.state.phase == "Progressing" and p.state.step == 1


def test_waits_for_traffic():
    s = start()
    p = plan(s, rev("b"), 4, STEPS, W, 62.0, Analysis(None, None, None, None, 2, 0), GATE)
    assert p.state.step == 0 and p.state.last_decision.action == "Waiting"
    assert "waiting for traffic" in p.state.last_decision.reason


def test_revert_aborts_and_no_steps_replaces():
    s = start()
    p = plan(s, rev("a"), 4, STEPS, W, 10.0, None, GATE)
    assert p.state.phase == "Stable" and p.state.candidate is None and p.events[0][1] == "RolloutAborted"
    p2 = plan(p.state, rev("c"), 4, [], W, 11.0, None, GATE)
    assert p2.state.stable.revision == rev("c").revision and p2.candidate_replicas == 0


def test_restart_safe_roundtrip_through_status():
    s = start()
    p = plan(s, rev("b"), 4, STEPS, W, 62.0, good(), GATE)
    status = p.state.to_status()
    assert status["windowStartedAt"] == 62.0 and status["candidate"]["revision"] == rev("b").revision
    # a new operator process reads the status back and continues at the same step
    s2 = RolloutState.from_status(status)
    assert s2 == p.state
    s3 = restart_window(s2, 100.0)
    assert s3.window_started_at == 100.0 and s3.step == 1
    p3 = plan(s3, rev("b"), 4, STEPS, W, 130.0, good(), GATE)
    assert p3.state.step == 1  # the restarted window is not over yet
    p4 = plan(s3, rev("b"), 4, STEPS, W, 161.0, good(), GATE)
    assert p4.state.step == 2


def test_merge_patch_deletes_and_diffs():
    from nightjar_operator.fleet.rollout import merge_patch

    old = {"phase": "Progressing", "candidate": {"revision": "b", "label": "x"}, "step": 1}
    new = {"phase": "Stable", "step": 1, "stable": {"revision": "b"}}
    assert merge_patch(old, new) == {"candidate": None, "phase": "Stable", "stable": {"revision": "b"}}
    assert merge_patch(new, new) is None
    assert merge_patch({"a": {"b": 1, "c": 2}}, {"a": {"b": 1}}) == {"a": {"c": None}}
    # to_status leaves out nulls, so a finished rollout's patch removes the candidate
    s = start()
    done = RolloutState(stable=s.candidate)
    assert merge_patch(s.to_status(), done.to_status())["candidate"] is None
