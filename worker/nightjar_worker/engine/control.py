"""Cross-area glue for the scheduler, in one place: the gamma policy (planner area), the runtime
config watcher and the Prometheus recorder (serving area), step listeners and the step log.

Runs in vLLM's EngineCore process. Environment:
  NIGHTJAR_CONFIG        runtime config file (``WorkerRuntimeConfig``), watched for live updates
  NIGHTJAR_CONFIG_POLL_S watcher poll interval (default 1.0; 0 = load once, no thread)
  NIGHTJAR_SNAPSHOT_S    how often the planner's estimates go to /metrics (default 1.0 s)
  NIGHTJAR_PROFILE       optional CostProfile JSON (needed by policies 'dsd' and 'oracle')
  NIGHTJAR_FORCE_GAMMA   forced cycled schedule, e.g. "0x5,4x5" (overrides the policy; tests)
  NIGHTJAR_STEP_LOG      append every step's record as a JSON line to this file
  NIGHTJAR_SCHEDULER_HOOK "module:function" called with the scheduler once it is built
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nightjar_worker.engine.forced import ForcedSchedulePolicy
from nightjar_worker.engine.step_stats import JsonlSink
from nightjar_worker.planner.policy import (
    DraftAware,
    GammaPolicy,
    PlannerView,
    QueueAware,
    QueuedPrompt,
    SourcePolicy,
    StepFeedback,
)

log = logging.getLogger("nightjar.engine")

StepListener = Callable[[StepFeedback], None]
_listeners: list[StepListener] = []


def add_step_listener(fn: StepListener) -> None:
    """Call ``fn(StepFeedback)`` after every step of every NightjarScheduler in this process."""
    _listeners.append(fn)


def remove_step_listener(fn: StepListener) -> None:
    if fn in _listeners:
        _listeners.remove(fn)


def _metrics() -> Any:
    try:
        from nightjar_worker.metrics import worker_metrics

        return worker_metrics()
    except Exception as e:  # noqa: BLE001 - metrics are optional for the engine's correctness
        log.warning("nightjar: metrics unavailable (%s)", e)
        return None


class EngineControl:
    """Owns the live policy for one scheduler: ``decide`` before a step, ``observe`` after it.

    Step contract::

        gamma, decide_s = ctl.decide(batch_size, prompt_tokens)  # policy.decide under the lock, clamped to [0, K]
        ...run the step...
        ctl.observe(StepFeedback(...))              # policy.observe + per-step nightjar_* metrics

    Both take ``ctl.lock`` (shared with the config watcher) so an update never lands mid-decision.
    The planner's ``snapshot()`` goes to ``nightjar_planner_loss_seconds``/``_count`` at most every
    ``snapshot_every_s`` (it allocates: not worth doing per step) and at once after a config update.
    Arguments left as None come from the environment (see the module docstring).
    """

    def __init__(
        self,
        max_gamma: int,
        *,
        config_path: str | os.PathLike[str] | None = None,
        profile: Any = None,
        poll_s: float | None = None,
        snapshot_every_s: float | None = None,
    ) -> None:
        self.max_gamma = max_gamma
        self.lock: threading.RLock = threading.RLock()
        self.metrics = _metrics()
        self.watcher: Any = None
        self.holder: Any = None
        self._policy: GammaPolicy | None = None
        self._sink: JsonlSink | None = None
        if snapshot_every_s is None:
            snapshot_every_s = float(os.environ.get("NIGHTJAR_SNAPSHOT_S", "1.0"))
        self._snapshot_every_s = snapshot_every_s
        self._last_snapshot = float("-inf")
        self.source = "draft"  # of the last decision
        forced = os.environ.get("NIGHTJAR_FORCE_GAMMA")
        if forced:
            self._policy = ForcedSchedulePolicy(forced, max_gamma)
            log.info("nightjar: forced gamma schedule %s", forced)
        else:
            self._init_policy_from_config(config_path, profile, poll_s)
        if os.environ.get("NIGHTJAR_STEP_LOG"):
            self._sink = JsonlSink(os.environ["NIGHTJAR_STEP_LOG"])
        arms = tuple(self.policy.arms)
        if max(arms, default=0) > max_gamma:
            log.warning(
                "nightjar: policy arms %s exceed K=%d (speculative_config.num_speculative_tokens); "
                "larger gammas are clamped to K",
                arms,
                max_gamma,
            )

    def _init_policy_from_config(self, path: Any, profile: Any, poll: float | None) -> None:
        from nightjar_worker.runtime_config import (
            PolicyHolder,
            RuntimeConfigWatcher,
            config_path_from_env,
            load_runtime_config,
        )

        path = os.fspath(path) if path is not None else config_path_from_env()
        if profile is None and os.environ.get("NIGHTJAR_PROFILE"):
            from nightjar_worker.sim.profile import CostProfile

            profile = CostProfile.load(os.environ["NIGHTJAR_PROFILE"])
        cfg = load_runtime_config(path)  # raises with the field named on a malformed file
        self.holder = PolicyHolder(cfg, profile)
        kwargs = {} if self.metrics is None else {"metrics": self.metrics}
        if poll is None:
            poll = float(os.environ.get("NIGHTJAR_CONFIG_POLL_S", "1.0"))
        self.watcher = RuntimeConfigWatcher(path, self.holder, interval_s=max(poll, 0.05), **kwargs)
        self.lock = self.watcher.lock
        self.watcher.load_initial()
        if poll > 0:
            self.watcher.start()
        log.info("nightjar: policy %s from %s", getattr(self.policy, "name", "?"), path)

    @property
    def policy(self) -> GammaPolicy:
        return self.holder.policy if self.holder is not None else self._policy  # type: ignore[return-value]

    def set_policy(self, policy: GammaPolicy) -> None:
        """Replace the live policy (tests, profiler); the config watcher keeps updating the holder's."""
        with self.lock:
            self.holder = None
            self._policy = policy

    def wants_queue(self) -> bool:
        """Whether the live policy prices the waiting prompts now (``QueueAware``)."""
        pol = self.policy
        return isinstance(pol, QueueAware) and pol.wants_queue()

    def decide(self, batch_size: int, prompt_tokens: int = 0,
               queue: tuple[QueuedPrompt, ...] | None = None) -> tuple[int, float]:
        """(gamma, decide seconds); ``self.source`` is the source of its drafts (``SOURCES``).
        ``queue``: the prompts waiting for their first token, for a ``QueueAware`` policy."""
        t0 = time.perf_counter()
        with self.lock:
            pol = self.policy
            if queue is not None and isinstance(pol, QueueAware):
                pol.observe_queue(queue)
            g = int(pol.decide(max(1, batch_size), max(0, prompt_tokens)))
            self.source = pol.source() if isinstance(pol, SourcePolicy) and g > 0 else "draft"
        dt = time.perf_counter() - t0
        if self.metrics is not None:
            self.metrics.observe_decision(dt)
        return min(max(g, 0), self.max_gamma), dt

    def set_draft_available(self, available: bool) -> None:
        """The memory manager's word on whether the draft can run, for the policy's next decision."""
        with self.lock:
            if isinstance(self.policy, DraftAware):
                self.policy.set_draft_available(available)

    def draft_demand(self, gamma: int, batch_size: int) -> int:
        """The draft gamma the policy wants this step: the chosen ``gamma`` when its source is the
        draft model; while the draft is away, what a DraftAware policy would play with it."""
        with self.lock:
            if self.source == "draft" and gamma > 0:
                return gamma
            pol = self.policy
            return max(0, int(pol.draft_demand(max(1, batch_size)))) if isinstance(pol, DraftAware) else 0

    def outlook(self, batch_size: int) -> tuple[float | None, float]:
        """(seconds a step saves by speculating, expected C_switch of resuming) at this batch, what
        the memory manager weighs a draft reload against; (None, 0.0) for a policy that learns
        neither (a reload is then trusted to the policy's choice)."""
        with self.lock:
            if isinstance(self.policy, PlannerView):
                b = max(1, batch_size)
                return self.policy.speculation_gain_s(b), self.policy.switch_cost_s(b)
        return None, 0.0

    def observe(self, rec: StepFeedback) -> None:
        now = time.monotonic()
        with self.lock:
            self.policy.observe(rec)
            view = self.policy if isinstance(self.policy, PlannerView) else None
            counts = replace(view.stats) if view is not None else None  # a copy, read outside the lock
            snap = gate_closed = draft_prefill = None
            if view is not None and self.metrics is not None and now - self._last_snapshot >= self._snapshot_every_s:
                self._last_snapshot = now
                snap = view.snapshot()
                gate_closed = view.acceptance_gate_closed()
                draft_prefill = view.draft_prefill_per_token()
        if self.metrics is not None:
            self.metrics.observe_step(rec.gamma, rec.batch_size, rec.num_draft_tokens, rec.num_accepted_tokens,
                                      rec.source, rec.verified_source)
            if rec.switch_cost_s > 0:
                self.metrics.observe_switch_cost(rec.switch_cost_s)
            if counts is not None:
                self.metrics.observe_planner_counts(counts)
            if snap is not None:
                self.metrics.set_planner_snapshot(snap)
            if gate_closed is not None:
                self.metrics.set_acceptance_gate(gate_closed)
            if draft_prefill is not None:
                self.metrics.set_draft_prefill(draft_prefill)
        if self._sink is not None:
            self._sink(rec)
        for fn in list(_listeners):
            try:
                fn(rec)
            except Exception:  # noqa: BLE001 - a listener must never break the engine
                log.exception("nightjar: step listener failed")

    def run_scheduler_hook(self, scheduler: Any) -> None:
        spec = os.environ.get("NIGHTJAR_SCHEDULER_HOOK")
        if not spec:
            return
        mod, _, fn = spec.partition(":")
        if not fn:
            raise ValueError(f"NIGHTJAR_SCHEDULER_HOOK: expected 'module:function', got {spec!r}")
        getattr(importlib.import_module(mod), fn)(scheduler)

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        if self._sink is not None:
            self._sink.close()
