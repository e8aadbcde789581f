"""When to offload the draft and when to bring it back (pure logic, one decision per step).

Step contract: every scheduler step the engine builds a ``MemoryView`` (what the planner wants
and how loaded the KV cache is) and calls ``OffloadPolicy.decide(view, state, now)``; the
returned ``Action`` is carried out by ``ElasticMemoryManager``.

* Offload when the planner has held gamma == 0 for ``offload_after_steps`` consecutive steps
  *and* there is memory pressure (requests waiting, or KV usage >= ``kv_usage_high``): an idle
  draft under pressure only takes bytes the KV cache needs.
* Start draining back when, for ``reload_after_steps`` consecutive steps, the planner wants
  gamma > 0, nothing waits, the blocks in use fit in ``kv_usage_low`` of the base pool, and the
  expected saving over ``amortize_steps`` steps exceeds the reload time plus C_switch.
* Or, a recheck: offloaded for ``recheck_after_s`` and the KV cache calm as above for
  ``reload_after_steps`` steps, whatever the planner wants. While the draft is away the planner
  learns nothing new about it, so its wish rests on estimates from before the load (another arm,
  such as prompt lookup, may look better on content that has since changed); the blocks the draft
  takes back are idle at that point, so its return costs only the move.
* Hysteresis: two thresholds (``kv_usage_low`` < ``kv_usage_high``), consecutive-step counters,
  and a minimum dwell time in RESIDENT / OFFLOADED so the draft does not ping-pong.
* A drain is cancelled (back to OFFLOADED) as soon as pressure returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from nightjar_contract.memory import OffloadPolicyConfig

from .offload_state import DraftState


@dataclass(frozen=True, slots=True)
class MemoryView:
    """The planner's and the scheduler's view of one step (filled by the engine)."""

    planner_gamma: int  # what the planner would choose this step, before clamping to the draft state
    batch_size: int
    num_waiting: int
    used_blocks: int  # KV blocks in use (all pools)
    allowed_blocks: int  # blocks the scheduler may use right now
    base_blocks: int  # blocks available with the draft resident
    spec_gain_s: float | None = None  # planner's expected seconds saved per step by speculating
    switch_cost_s: float = 0.0  # measured C_switch (draft KV catch-up)
    reload_cost_s: float = 0.0  # expected duration of a reload (last measured)

    @property
    def kv_usage(self) -> float:
        return self.used_blocks / max(1, self.allowed_blocks)

    @property
    def base_usage(self) -> float:
        return self.used_blocks / max(1, self.base_blocks)


class Action(str, Enum):
    NONE = "none"
    OFFLOAD = "offload"
    DRAIN = "drain"  # start bringing the draft back: stop handing out extra blocks
    CANCEL_DRAIN = "cancel_drain"
    CANCEL_RELOAD = "cancel_reload"  # back to OFFLOADED: the extra blocks again, the reload's work lost


class OffloadPolicy:
    """Hysteresis over consecutive steps; keeps only counters (deterministic, no I/O)."""

    def __init__(self, config: OffloadPolicyConfig | None = None) -> None:
        self.config = config or OffloadPolicyConfig()
        self._pressure_zero_steps = 0
        self._calm_spec_steps = 0
        self._pressure_steps = 0
        self._calm_steps = 0
        self.trigger = ""  # why the last DRAIN: "demand" (the planner wants the draft) or "recheck"

    def pressure(self, view: MemoryView) -> bool:
        c = self.config
        return view.num_waiting >= c.waiting_threshold or view.kv_usage >= c.kv_usage_high

    def reload_pays(self, view: MemoryView) -> bool:
        """The planner expects speculation to recover the reload and C_switch within the horizon."""
        if view.planner_gamma <= 0:
            return False
        if view.spec_gain_s is None:  # no estimate yet: trust the planner's choice
            return True
        return view.spec_gain_s * self.config.amortize_steps > view.reload_cost_s + view.switch_cost_s

    def decide(
        self,
        view: MemoryView,
        state: DraftState,
        time_in_state_s: float,
        retry_allowed: bool = True,
    ) -> Action:
        c = self.config
        pressure = self.pressure(view)
        self._pressure_steps = self._pressure_steps + 1 if pressure else 0
        self._pressure_zero_steps = self._pressure_zero_steps + 1 if pressure and view.planner_gamma == 0 else 0
        calm = not pressure and view.num_waiting == 0 and view.base_usage <= c.kv_usage_low
        self._calm_steps = self._calm_steps + 1 if calm else 0
        wanted = calm and self.reload_pays(view)
        self._calm_spec_steps = self._calm_spec_steps + 1 if wanted else 0
        if not c.enabled:
            return Action.NONE

        if state is DraftState.RESIDENT:
            if self._pressure_zero_steps >= c.offload_after_steps and time_in_state_s >= c.min_resident_s:
                self._reset()
                return Action.OFFLOAD
        elif state is DraftState.OFFLOADED:
            demand = self._calm_spec_steps >= c.reload_after_steps
            recheck = (c.recheck_after_s is not None and time_in_state_s >= c.recheck_after_s
                       and self._calm_steps >= c.reload_after_steps)
            if (demand or recheck) and time_in_state_s >= c.min_offloaded_s and retry_allowed:
                self._reset()
                self.trigger = "demand" if demand else "recheck"
                return Action.DRAIN
        elif state in (DraftState.DRAINING, DraftState.RELOADING):
            # Pressure during a drain or a reload means the extra blocks are needed again. A stepped CPU
            # reload of a large draft spans many steps (Qwen 0.5B fp32: 150 s at low load), all of them
            # without speculation and in the base pool: a load rising meanwhile needs the blocks now.
            if self._pressure_steps >= c.offload_after_steps:
                self._reset()
                return Action.CANCEL_DRAIN if state is DraftState.DRAINING else Action.CANCEL_RELOAD
        return Action.NONE

    def _reset(self) -> None:
        self._pressure_zero_steps = self._calm_spec_steps = self._pressure_steps = self._calm_steps = 0
