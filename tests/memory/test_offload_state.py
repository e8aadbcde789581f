import pytest
from nightjar_worker.memory.offload_state import (
    ALLOWED_TRANSITIONS,
    DraftState,
    DraftStateMachine,
    InvalidTransition,
)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_full_cycle_records_durations_and_notifies():
    clock = Clock()
    sm = DraftStateMachine(clock=clock)
    seen = []
    sm.add_listener(seen.append)
    assert sm.draft_available and not sm.extra_blocks_allocatable
    clock.t += 5
    sm.to(DraftState.OFFLOADING, "pressure")
    assert not sm.draft_available
    clock.t += 0.25
    sm.to(DraftState.OFFLOADED, "copied")
    assert sm.extra_blocks_allocatable
    clock.t += 10
    sm.to(DraftState.DRAINING, "calm")
    assert not sm.extra_blocks_allocatable
    clock.t += 1
    sm.to(DraftState.RELOADING, "drained")
    clock.t += 0.5
    sm.to(DraftState.RESIDENT, "reloaded")
    assert sm.draft_available
    assert [(t.src, t.dst) for t in seen] == [
        (DraftState.RESIDENT, DraftState.OFFLOADING),
        (DraftState.OFFLOADING, DraftState.OFFLOADED),
        (DraftState.OFFLOADED, DraftState.DRAINING),
        (DraftState.DRAINING, DraftState.RELOADING),
        (DraftState.RELOADING, DraftState.RESIDENT),
    ]
    assert [t.duration_s for t in seen] == [5, 0.25, 10, 1, 0.5]
    assert seen[1].reason == "copied"


@pytest.mark.parametrize("src", list(DraftState))
@pytest.mark.parametrize("dst", list(DraftState))
def test_only_allowed_transitions(src, dst):
    sm = DraftStateMachine(initial=src)
    if dst in ALLOWED_TRANSITIONS[src]:
        sm.to(dst, "x")
        assert sm.state is dst
    else:
        with pytest.raises(InvalidTransition, match=f"{src.label} -> {dst.label}"):
            sm.to(dst, "x")
        assert sm.state is src


def test_failures_fall_back_to_safe_states():
    sm = DraftStateMachine(initial=DraftState.RELOADING)
    sm.to(DraftState.OFFLOADED, "reload failed")  # keep serving AR, retry later
    sm = DraftStateMachine(initial=DraftState.OFFLOADING)
    sm.to(DraftState.RESIDENT, "offload failed")  # device weights were never freed
    assert sm.draft_available


def test_speculation_only_when_resident():
    for s in DraftState:
        assert DraftStateMachine(initial=s).draft_available is (s is DraftState.RESIDENT)
