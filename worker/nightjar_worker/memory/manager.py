"""``ElasticMemoryManager``: the scheduler-process half of elastic draft memory.

Step contract (called by ``NightjarScheduler.schedule`` before vLLM schedules the step)::

    gain_s, switch_s = control.outlook(batch)  # the planner's PlannerView
    directive = manager.on_step(planner_gamma, spec_gain_s=gain_s, switch_cost_s=switch_s)
    gamma = directive.clamp(planner_gamma)   # 0 unless the draft is fully resident

``on_step`` (1) collects finished background moves from the worker, (2) asks the offload policy
(or the pinned mode) what to do, (3) moves the KV block limit, and returns whether the draft may
run this step and how many blocks the scheduler may use. All worker work goes through vLLM's
``collective_rpc`` (functions in ``worker_agent.py``); weight copies run in a worker thread, so
the engine keeps decoding (gamma 0) while the draft moves. Every transition is a log line and a
metric (``nightjar_draft_*``, ``nightjar_kv_blocks_*``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from nightjar_contract.memory import MEMORY_MODES, ElasticMemoryConfig

from . import worker_agent as wa
from .availability import UNAVAILABLE_MESSAGES, availability
from .fault import RetryBackoff
from .kv_elastic import ElasticBlockPool, plan_extra_blocks, requests_holding
from .offload_policy import Action, MemoryView, OffloadPolicy
from .offload_state import DraftState, DraftStateMachine, Transition

log = logging.getLogger("nightjar.memory")

Rpc = Callable[..., list[Any]]


@dataclass(frozen=True, slots=True)
class StepDirective:
    draft_available: bool
    allowed_blocks: int
    state: DraftState

    def clamp(self, gamma: int) -> int:
        return gamma if self.draft_available else 0


def _metrics() -> Any:
    try:
        from nightjar_worker.metrics import worker_metrics

        return worker_metrics()
    except Exception as e:  # noqa: BLE001 - metrics must never stop the engine
        log.warning("nightjar memory: metrics unavailable (%s)", e)
        return None


def find_engine_rpc(max_depth: int = 12) -> Rpc | None:
    """The ``collective_rpc`` of the vLLM executor that is constructing the caller.

    vLLM's EngineCore builds its executor before the scheduler and hands the scheduler no handle to
    it; the EngineCore is the ``self`` of a frame up the stack of ``Scheduler.__init__``.
    """
    f: FrameType | None = sys._getframe(1)
    for _ in range(max_depth):
        if f is None:
            break
        obj = f.f_locals.get("self")
        ex = getattr(obj, "model_executor", None)
        if ex is not None and hasattr(ex, "collective_rpc"):
            rpc: Rpc = ex.collective_rpc
            return rpc
        f = f.f_back
    return None


class ElasticMemoryManager:
    def __init__(
        self,
        scheduler: Any,
        rpc: Rpc,
        config: ElasticMemoryConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scheduler = scheduler
        self.rpc = rpc
        self.config = config
        self.clock = clock
        self.metrics = _metrics()
        infos = rpc(wa.rpc_init, args=(config.host_store, config.offload_dir, config.release_pages))
        self.worker_info = infos[0]
        self.draft_bytes = sum(i["draft_bytes"] for i in infos)
        self.block_bytes = sum(i["block_bytes"] for i in infos)
        block_pool = scheduler.kv_cache_manager.block_pool
        total = block_pool.num_gpu_blocks
        # one request of max_model_len must fit while the draft is resident
        block_size = max(1, int(getattr(scheduler, "block_size", 0) or 16))
        min_base = -(-int(getattr(scheduler, "max_model_len", 0) or block_size) // block_size)
        base, extra = plan_extra_blocks(total, config.base_blocks, self.draft_bytes, self.block_bytes, min_base)
        self.pool = ElasticBlockPool(block_pool, base, extra)
        self.released_bytes = 0  # of the KV pool, given back now (nightjar_kv_released_bytes)
        if config.release_pages:  # the held-back part of the pool costs no memory from now on
            # (base + extra: what the worker maps back in the background once the draft is off)
            self._count_released(sum(rpc(wa.rpc_release_from, args=(base, base + extra))))
        self.policy = OffloadPolicy(config.policy)
        self.backoff = RetryBackoff(config.backoff)
        self.sm = DraftStateMachine(clock=clock)
        self.sm.add_listener(self._on_transition)
        self.last_reload_s = 0.0
        self.reload_failures = 0
        self.reload_cancels = 0
        self.step = 0
        self.steps_in_state = 0
        self._control_mtime: float | None = None
        self._mode = config.mode
        self._trace = open(config.trace_file, "a", buffering=1) if config.trace_file else None  # noqa: SIM115
        self._last_step_t: float | None = None
        self._write_trace({"event": "init", **self.stats()})
        if self.metrics is not None:
            self.metrics.draft_state_changed(None, DraftState.RESIDENT.label)
            self.metrics.set_kv_blocks(self.pool.allowed_blocks(), 0)
        log.info(
            "nightjar memory: elastic draft memory on: pool %d blocks, base %d, extra %d when offloaded "
            "(draft %d bytes / block %d bytes = %.2f), %d bytes of held-back KV pages released, mode %s",
            total, base, extra, self.draft_bytes, self.block_bytes, self.draft_bytes / self.block_bytes,
            self.released_bytes, self._mode,
        )

    # -- construction from a scheduler ------------------------------------------------------------------
    @classmethod
    def attach_if_enabled(cls, scheduler: Any, vllm_config: Any) -> ElasticMemoryManager | None:
        cfg, _, reason = availability(vllm_config)
        m = _metrics()
        if m is not None:
            m.set_offload_enabled(reason is None, reason or "enabled")
        if reason is not None:
            if cfg.enabled:  # asked for and not possible: serve with the draft resident, and say why
                log.warning("nightjar memory: elastic draft memory requested but off (%s): %s",
                            reason, UNAVAILABLE_MESSAGES[reason])
            return None
        rpc = find_engine_rpc()
        if rpc is None:
            raise RuntimeError(
                "elastic memory: enabled but no vLLM executor found above the scheduler's constructor "
                "(is the scheduler built by vLLM's EngineCore?)"
            )
        return cls(scheduler, rpc, cfg)

    # -- state transitions: side effects, metrics, logs --------------------------------------------------
    def _on_transition(self, tr: Transition) -> None:
        m = self.metrics
        if m is not None:
            m.draft_state_changed(tr.src.label, tr.dst.label)
            extra = self.pool.limit - self.pool.base
            m.set_kv_blocks(self.pool.allowed_blocks(), extra)
        log.info(
            "nightjar memory: draft %s -> %s after %.3fs (%s); KV blocks usable %d (extra %d)",
            tr.src.label, tr.dst.label, tr.duration_s, tr.reason, self.pool.allowed_blocks(),
            self.pool.limit - self.pool.base,
        )
        self.steps_in_state = 0
        self._write_trace({"event": "transition", "from": tr.src.label, "to": tr.dst.label, "reason": tr.reason,
                           "duration_s": tr.duration_s})

    def _write_trace(self, rec: dict[str, Any]) -> None:
        if self._trace is not None:
            rec.setdefault("t", time.time())
            self._trace.write(json.dumps(rec) + "\n")

    def _poll(self) -> dict[str, Any]:
        return self._merge(self.rpc(wa.rpc_poll, args=(self.config.reload_slice_s,)))

    @staticmethod
    def _merge(res: list[dict[str, Any]]) -> dict[str, Any]:
        """One progress report from every worker's: done, cancelled only when all are; errors joined."""
        out = dict(res[0])
        out["done"] = all(r.get("done", True) for r in res)
        errs = [r["error"] for r in res if r.get("error")]
        out["error"] = "; ".join(errs) if errs else None
        out["duration_s"] = max(r.get("duration_s", 0.0) for r in res)
        out["cancelled"] = all(r.get("cancelled", False) for r in res)
        return out

    def _start(self, op: Callable[..., Any], what: str, args: tuple[Any, ...] = ()) -> tuple[Any, str | None]:
        """(every worker's reply, None), or (None, the error) when a worker refused."""
        try:
            return self.rpc(op, args=args), None
        except Exception as e:  # noqa: BLE001 - e.g. a worker refusing; reported as a failed move
            log.warning("nightjar memory: could not start draft %s: %s", what, e)
            return None, f"{type(e).__name__}: {e}"

    def _mode_now(self) -> str:
        path = self.config.control_file
        if path:
            try:
                mt = os.stat(path).st_mtime
                if mt != self._control_mtime:
                    self._control_mtime = mt
                    val = open(path).read().strip() or "auto"  # noqa: SIM115
                    if val not in MEMORY_MODES:
                        log.error("nightjar memory: control file %s: mode %r is not auto|resident|offloaded", path, val)
                    elif val != self._mode:
                        log.info("nightjar memory: mode %s -> %s (control file)", self._mode, val)
                        self._mode = val
            except FileNotFoundError:
                pass
        return self._mode

    def set_mode(self, mode: str) -> None:
        if mode not in MEMORY_MODES:
            raise ValueError(f"mode: expected auto|resident|offloaded, got {mode!r}")
        self._mode = mode

    # -- the step hook -------------------------------------------------------------------------------------
    def view(self, planner_gamma: int, spec_gain_s: float | None, switch_cost_s: float) -> MemoryView:
        s = self.scheduler
        return MemoryView(
            planner_gamma=planner_gamma,
            batch_size=len(s.running),
            num_waiting=len(s.waiting),
            used_blocks=self.pool.used_blocks(),
            allowed_blocks=self.pool.allowed_blocks(),
            base_blocks=self.pool.base - 1,
            spec_gain_s=spec_gain_s,
            switch_cost_s=switch_cost_s,
            reload_cost_s=self.last_reload_s,
        )

    def on_step(self, planner_gamma: int, spec_gain_s: float | None = None, switch_cost_s: float = 0.0) -> StepDirective:
        t_in = time.perf_counter()
        now = self.clock()
        self.step += 1
        self.steps_in_state += 1
        sm, pool = self.sm, self.pool
        st = sm.state

        # 1. progress of background moves
        if st in (DraftState.OFFLOADING, DraftState.RELOADING):
            p = self._poll()
            if p["done"]:
                if st is DraftState.OFFLOADING:
                    if p["error"]:
                        sm.to(DraftState.RESIDENT, f"offload failed: {p['error']}")
                    else:
                        self._expose_extra()
                        if self.metrics is not None:
                            self.metrics.observe_offload(p["duration_s"])
                        sm.to(DraftState.OFFLOADED, f"weights on host ({p.get('bytes', 0)} bytes copied)")
                else:
                    self._finish_reload(p, now)

        # 2. decide
        mode = self._mode_now()
        view = self.view(planner_gamma, spec_gain_s, switch_cost_s)
        st = sm.state
        action = self.policy.decide(view, st, sm.time_in_state(), retry_allowed=self.backoff.allowed(now))
        if mode == "resident":
            action = Action.DRAIN if st is DraftState.OFFLOADED and self.backoff.allowed(now) else Action.NONE
        elif mode == "offloaded":
            action = {DraftState.RESIDENT: Action.OFFLOAD, DraftState.DRAINING: Action.CANCEL_DRAIN}.get(st, Action.NONE)

        # 3. act
        if action is Action.OFFLOAD:
            reason = "pinned offloaded" if mode == "offloaded" else (
                f"gamma 0 under pressure: waiting {view.num_waiting}, KV usage {view.kv_usage:.2f}")
            sm.to(DraftState.OFFLOADING, reason)
            _, err = self._start(wa.rpc_offload, "offload")
            if err:
                sm.to(DraftState.RESIDENT, f"offload failed: {err}")
        elif action is Action.DRAIN:
            pool.set_limit(pool.base)
            trigger = "pinned" if mode == "resident" else self.policy.trigger
            if self.metrics is not None:
                self.metrics.observe_return(trigger)
            sm.to(DraftState.DRAINING, {
                "pinned": "pinned resident",
                "demand": f"planner wants gamma {planner_gamma}, KV usage of base {view.base_usage:.2f}",
                "recheck": f"recheck: the KV cache calm (usage of base {view.base_usage:.2f}) after "
                           f"{sm.time_in_state():.0f}s offloaded"}[trigger])
        elif action is Action.CANCEL_DRAIN:
            self._expose_extra()
            sm.to(DraftState.OFFLOADED, "pressure returned while draining")
        elif action is Action.CANCEL_RELOAD:
            res, err = self._start(wa.rpc_cancel, "reload cancel")
            # the reply is a poll: a stepped (CPU) reload stops at once; a threaded (CUDA, ~1 s) one runs on
            if err is None and (p := self._merge(res))["done"]:
                self._finish_reload(p, now)

        # 4. drain: reload once no request holds an extra block
        if sm.state is DraftState.DRAINING:
            pool.sweep()
            if pool.drained:
                self._begin_reload()
            elif sm.time_in_state() >= self.config.policy.drain_timeout_s:
                self._preempt_holders()

        d = StepDirective(sm.draft_available, pool.allowed_blocks(), sm.state)
        if self._trace is not None:
            t = time.perf_counter()
            self._write_trace({
                "step": self.step, "state": sm.state.label, "running": view.batch_size,
                "waiting": view.num_waiting, "used": pool.used_blocks(), "allowed": d.allowed_blocks,
                "gamma": d.clamp(planner_gamma),
                "dt": None if self._last_step_t is None else t - self._last_step_t,
                "work_s": t - t_in,  # this hook's own time (reload slices, page release), inside dt
            })
            self._last_step_t = t
        return d

    def _expose_extra(self) -> None:
        """Let the scheduler use the extra blocks, their memory mapped again first (on CUDA unmapped
        device memory faults; the draft's weights are off the device by now, so the bytes are there).
        If mapping fails the limit stays at base: fewer blocks, never a fault."""
        if self.config.release_pages and self.pool.extra:
            try:
                mapped = sum(self.rpc(wa.rpc_restore, args=(self.pool.base, self.pool.base + self.pool.extra)))
            except Exception as e:  # noqa: BLE001
                log.warning("nightjar memory: mapping the extra KV blocks' memory failed (%s: %s); serving "
                            "with the base blocks only", type(e).__name__, e)
                return
            self._count_released(-mapped)
        self.pool.set_limit(self.pool.base + self.pool.extra)

    def _count_released(self, delta: int) -> None:
        self.released_bytes = max(0, self.released_bytes + delta)
        if self.metrics is not None:
            self.metrics.set_kv_released_bytes(self.released_bytes)

    def _begin_reload(self) -> None:
        pool = self.pool
        released = 0
        if self.config.release_pages and pool.extra:
            try:
                released = sum(self.rpc(wa.rpc_release_from, args=(pool.base, pool.base + pool.extra)))
            except Exception as e:  # noqa: BLE001
                self._reload_failed(f"releasing KV pages: {type(e).__name__}: {e}", self.clock())
                return
            self._count_released(released)
        self.sm.to(DraftState.RELOADING, f"extra blocks drained, {released} bytes of KV pages released")
        _, err = self._start(wa.rpc_reload, "reload", args=(self.config.reload_slice_s, self.config.reload_slice_bytes))
        if err:
            self._reload_failed(err, self.clock())

    def _finish_reload(self, p: dict[str, Any], now: float) -> None:
        if p["cancelled"]:  # not a failure: no back-off, the policy's own hysteresis paces the next try
            self.reload_cancels += 1
            if self.metrics is not None:
                self.metrics.observe_reload_cancel()
            self._expose_extra()
            self.sm.to(DraftState.OFFLOADED, f"pressure returned while reloading: reload cancelled after "
                       f"{p['duration_s']:.3f}s, its work discarded")
            return
        if p["error"]:
            self._reload_failed(p["error"], now)
            return
        self.last_reload_s = p["duration_s"]
        self.backoff.record_success()
        if self.metrics is not None:
            self.metrics.observe_reload(p["duration_s"], ok=True)
        self.sm.to(DraftState.RESIDENT, f"weights back in {p['duration_s']:.3f}s")

    def _reload_failed(self, reason: str, now: float) -> None:
        self.reload_failures += 1
        delay = self.backoff.record_failure(now)
        if self.metrics is not None:
            self.metrics.observe_reload(None, ok=False)
        # Serve autoregressively with the extra blocks again until the retry.
        self._expose_extra()
        self.sm.to(DraftState.OFFLOADED, f"reload failed ({reason}); retry in {delay:.1f}s")
        log.warning("nightjar memory: draft reload failed (%s); serving in AR mode, retry in %.1fs", reason, delay)

    def _preempt_holders(self) -> None:
        s = self.scheduler
        busy = set(self.pool.busy_above())
        victims = requests_holding(s.kv_cache_manager, s.running, busy)
        for req in victims:
            s.running.remove(req)
            s._preempt_request(req, time.time())
        if victims:
            log.info("nightjar memory: drain timeout: preempted %d request(s) holding extra blocks (recompute)",
                     len(victims))
            self.pool.sweep()

    def wait_idle(self, timeout_s: float = 60.0) -> None:
        """Block until a background move finishes (tests)."""
        self.rpc(wa.rpc_wait, args=(timeout_s,))

    def stats(self) -> dict[str, Any]:
        return {
            "state": self.sm.state.label,
            "base_blocks": self.pool.base,
            "extra_blocks": self.pool.extra,
            "total_blocks": self.pool.total,
            "allowed_blocks": self.pool.allowed_blocks(),
            "used_blocks": self.pool.used_blocks(),
            "draft_bytes": self.draft_bytes,
            "block_bytes": self.block_bytes,
            "reload_failures": self.reload_failures,
            "reload_cancels": self.reload_cancels,
            "released_bytes": self.released_bytes,
            "last_reload_s": self.last_reload_s,
            "worker": self.worker_info,
        }

    def close(self) -> None:
        if self._trace is not None:
            self._trace.close()
            self._trace = None
