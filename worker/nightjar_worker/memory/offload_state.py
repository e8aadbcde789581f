"""The draft's residency state machine (pure logic: no torch, no vLLM, injectable clock).

    RESIDENT --offload--> OFFLOADING --copied--> OFFLOADED --load falls--> DRAINING
        ^                     |                     ^   ^                      |
        |                 (failure)                 |   +--(pressure returns)--+
        +---------------------+                     |                          |
        +------------------ RELOADING <--(extra KV blocks drained)-------------+
                                |
                                +--(failure)--> OFFLOADED (retry with back-off)

* RESIDENT: weights on the device, speculation allowed, KV pool at its base size.
* OFFLOADING: weights are being copied to host memory; gamma is held at 0.
* OFFLOADED: device copy freed; its bytes are exposed to the scheduler as extra KV blocks.
* DRAINING: the planner wants speculation back; new allocations are limited to the base
  pool and requests holding extra blocks finish (or are preempted) before any byte is reused.
* RELOADING: extra KV pages released, weights coming back asynchronously; decoding continues
  autoregressively and speculation resumes only on the RESIDENT transition (copy complete).

DRAINING is a fifth state (the issue's four plus the drain phase) so that the time spent waiting
for blocks is visible on its own and not mixed into the reload duration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum


class DraftState(IntEnum):
    """Values are the ``nightjar_draft_state`` gauge's values."""

    RESIDENT = 0
    OFFLOADING = 1
    OFFLOADED = 2
    RELOADING = 3
    DRAINING = 4  # appended so values 0-3 keep the order of metrics.DRAFT_STATES

    @property
    def label(self) -> str:
        return self.name.lower()


ALLOWED_TRANSITIONS: dict[DraftState, frozenset[DraftState]] = {
    DraftState.RESIDENT: frozenset({DraftState.OFFLOADING}),
    # Back to RESIDENT when the offload copy fails: the device weights were never freed.
    DraftState.OFFLOADING: frozenset({DraftState.OFFLOADED, DraftState.RESIDENT}),
    DraftState.OFFLOADED: frozenset({DraftState.DRAINING}),
    DraftState.DRAINING: frozenset({DraftState.RELOADING, DraftState.OFFLOADED}),
    # Back to OFFLOADED when the reload fails: serve autoregressively, retry later.
    DraftState.RELOADING: frozenset({DraftState.RESIDENT, DraftState.OFFLOADED}),
}


class InvalidTransition(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Transition:
    """One state change; ``duration_s`` is the time spent in ``src``."""

    src: DraftState
    dst: DraftState
    reason: str
    at_s: float
    duration_s: float


Listener = Callable[[Transition], None]


class DraftStateMachine:
    """Holds the current state and notifies listeners (metrics, logs) on every transition."""

    def __init__(
        self,
        initial: DraftState = DraftState.RESIDENT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._state = initial
        self._clock = clock
        self._since = clock()
        self._listeners: list[Listener] = []
        self.history: list[Transition] = []

    @property
    def state(self) -> DraftState:
        return self._state

    @property
    def since_s(self) -> float:
        return self._since

    def time_in_state(self) -> float:
        return self._clock() - self._since

    @property
    def draft_available(self) -> bool:
        """Speculation may run only with the full draft on the device."""
        return self._state is DraftState.RESIDENT

    @property
    def extra_blocks_allocatable(self) -> bool:
        """New KV allocations may use the extra blocks only while fully offloaded."""
        return self._state is DraftState.OFFLOADED

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def can(self, dst: DraftState) -> bool:
        return dst in ALLOWED_TRANSITIONS[self._state]

    def to(self, dst: DraftState, reason: str) -> Transition:
        if not self.can(dst):
            raise InvalidTransition(
                f"draft state: {self._state.label} -> {dst.label} is not allowed "
                f"(allowed: {sorted(s.label for s in ALLOWED_TRANSITIONS[self._state])})"
            )
        now = self._clock()
        tr = Transition(self._state, dst, reason, now, now - self._since)
        self._state, self._since = dst, now
        self.history.append(tr)
        del self.history[:-256]  # bounded: a long-running worker transitions many times
        for listener in self._listeners:
            listener(tr)
        return tr
