"""ElasticMemoryManager's control loop on vLLM's real BlockPool with an in-process worker double
(the rpc functions run against a fake worker whose draft is a small torch module)."""

from __future__ import annotations

import json
import threading
import time
import types

import pytest
import torch
from nightjar_contract.memory import ElasticMemoryConfig
from nightjar_worker.memory import worker_agent as wa
from nightjar_worker.memory.arena import HostArena
from nightjar_worker.memory.availability import UNAVAILABLE_MESSAGES, unavailable_reason
from nightjar_worker.memory.config import load_config
from nightjar_worker.memory.fault import FaultInjector
from nightjar_worker.memory.kv_pool import ARENA_ATTR
from nightjar_worker.memory.manager import ElasticMemoryManager
from nightjar_worker.memory.offload_state import DraftState
from nightjar_worker.metrics import WorkerMetrics
from prometheus_client import REGISTRY

NBLK, BASE = 100, 10
BLOCK_BYTES = 8192


class FakeRunner:
    def __init__(self, arena_cls: type = HostArena) -> None:
        self.device = torch.device("cpu")
        self.model = torch.nn.Linear(8, 8)
        draft = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))  # ~0.5 MB fp32
        self.drafter = types.SimpleNamespace(model=draft)
        self.arena = arena_cls(2 * NBLK * 4096)  # where kv_pool.install puts vLLM's KV pool
        flat = self.arena.tensor().view(torch.bfloat16)
        self.kv_caches = [flat[i * NBLK * 2048:(i + 1) * NBLK * 2048].view(NBLK, 2, 16, 64)
                          for i in range(2)]  # 4 KiB/layer/block
        setattr(self, ARENA_ATTR, self.arena)
        self.drafted = 0

    def _input_fits_in_drafter(self, *_):
        return True


class FakeScheduler:
    def __init__(self) -> None:
        from vllm.v1.core.block_pool import BlockPool

        self.kv_cache_manager = types.SimpleNamespace(block_pool=BlockPool(NBLK, False, 16))
        self.running: list = []
        self.waiting: list = []


def make(tmp_path, faults=0, arena_cls=HostArena, **cfg):
    worker = types.SimpleNamespace(model_runner=FakeRunner(arena_cls))

    def rpc(fn, args=()):
        return [fn(worker, *args)]

    sched = FakeScheduler()
    config = ElasticMemoryConfig(enabled=True, base_blocks=BASE, offload_dir=str(tmp_path),
                                 backoff={"base_s": 0.05, "factor": 2, "max_s": 0.1}, **cfg)
    m = ElasticMemoryManager(sched, rpc, config)
    wa._agent(worker).mover.faults = FaultInjector(faults)
    return m, sched, worker


def step_until(m, state, gamma=0, n=400, timeout_s=30.0):
    # Bounded by wall time as well as steps: back-off retries are due after a delay, and idle steps
    # can run faster than that delay on a quiet machine.
    deadline = time.monotonic() + timeout_s
    steps = 0
    while steps < n or time.monotonic() < deadline:
        d = m.on_step(gamma)
        steps += 1
        if m.sm.state is state:
            return d
        m.wait_idle(5)
        time.sleep(0.001)
    raise AssertionError(f"never reached {state}: {m.sm.history}")


def test_pinned_cycle_moves_the_block_limit(tmp_path):
    m, sched, worker = make(tmp_path, mode="offloaded")
    bp = sched.kv_cache_manager.block_pool
    arena = worker.model_runner.arena
    assert m.pool.extra == m.draft_bytes // m.block_bytes and m.pool.extra > 0
    assert arena.mapped_bytes() == arena.size - (NBLK - BASE) * 2 * 4096  # held back = not committed

    def released_is_reported():
        given_back = arena.size - arena.mapped_bytes()
        return m.released_bytes == given_back == REGISTRY.get_sample_value("nightjar_kv_released_bytes")

    assert released_is_reported()
    d = m.on_step(3)
    assert m.sm.state is DraftState.OFFLOADING and not d.draft_available and d.clamp(3) == 0
    assert not worker.model_runner._input_fits_in_drafter()  # the worker refuses to draft
    d = step_until(m, DraftState.OFFLOADED)
    assert d.allowed_blocks == BASE - 1 + m.pool.extra == bp.get_num_free_blocks()
    assert arena.mapped_bytes() == arena.size - (NBLK - BASE - m.pool.extra) * 2 * 4096  # mapped before use
    assert released_is_reported()
    held = bp.get_new_blocks(BASE + 3)  # the scheduler really gets the extra blocks
    m.set_mode("resident")
    m.on_step(3)
    assert m.sm.state is DraftState.DRAINING  # blocks >= BASE are still owned
    bp.free_blocks(held)
    d = step_until(m, DraftState.RESIDENT, gamma=3)
    assert d.draft_available and d.clamp(3) == 3 and d.allowed_blocks == BASE - 1
    assert arena.mapped_bytes() == arena.size - (NBLK - BASE) * 2 * 4096
    assert released_is_reported()
    assert worker.model_runner._input_fits_in_drafter()
    names = [(t.src.label, t.dst.label) for t in m.sm.history]
    assert names == [("resident", "offloading"), ("offloading", "offloaded"), ("offloaded", "draining"),
                     ("draining", "reloading"), ("reloading", "resident")]


def test_reload_failures_back_off_and_recover(tmp_path):
    m, sched, _ = make(tmp_path, faults=2, mode="offloaded")
    step_until(m, DraftState.OFFLOADED)
    m.set_mode("resident")
    step_until(m, DraftState.RESIDENT, gamma=2, n=2000)
    fails = [t for t in m.sm.history if t.src is DraftState.RELOADING and t.dst is DraftState.OFFLOADED]
    assert len(fails) == 2 and "injected" in fails[0].reason
    assert m.reload_failures == 2 and m.backoff.failures == 0
    gaps = [b.at_s - a.at_s for a, b in zip(fails, fails[1:], strict=False)]
    assert gaps[0] >= 0.05  # the retry waited for the back-off


def test_auto_policy_offloads_under_pressure(tmp_path):
    m, sched, _ = make(tmp_path, policy={"offload_after_steps": 3, "reload_after_steps": 3,
                                         "min_resident_s": 0, "min_offloaded_s": 0})
    sched.waiting = [object()] * 5
    for _ in range(3):
        m.on_step(0)
    assert m.sm.state is DraftState.OFFLOADING
    step_until(m, DraftState.OFFLOADED)
    sched.waiting = []
    step_until(m, DraftState.RESIDENT, gamma=4)


def test_pressure_during_a_stepped_reload_cancels_it(tmp_path):
    m, sched, worker = make(tmp_path, reload_slice_s=1e-9, reload_slice_bytes=1024,
                            policy={"offload_after_steps": 2, "reload_after_steps": 1,
                                    "min_resident_s": 0, "min_offloaded_s": 0})
    m.metrics = WorkerMetrics()
    cancels0 = REGISTRY.get_sample_value("nightjar_draft_reload_cancels_total") or 0.0
    sched.waiting = [object()] * 3
    m.on_step(0), m.on_step(0)
    step_until(m, DraftState.OFFLOADED)
    sched.waiting = []
    for _ in range(4):  # calm and the planner wants gamma 2: drain, then the reload starts (one item a step)
        m.on_step(2)
    assert m.sm.state is DraftState.RELOADING and m.pool.limit == m.pool.base
    sched.waiting = [object()] * 3
    m.on_step(0), m.on_step(0)
    assert m.sm.state is DraftState.OFFLOADED and "cancelled" in m.sm.history[-1].reason
    assert m.pool.limit == m.pool.base + m.pool.extra  # the extra blocks are lent again at once
    assert m.reload_failures == 0 and m.backoff.failures == 0  # a cancel is not a failure
    assert m.reload_cancels == 1 and m.stats()["reload_cancels"] == 1
    assert REGISTRY.get_sample_value("nightjar_draft_reload_cancels_total") == cancels0 + 1
    mover = wa._agent(worker).mover
    assert not mover.resident and mover.device_bytes() == 0
    sched.waiting = []
    step_until(m, DraftState.RESIDENT, gamma=2)  # and the next reload completes


def test_config_sources_and_errors(tmp_path, monkeypatch):
    assert not load_config({}, environ={}).enabled
    assert load_config({"nightjar_memory": {"enabled": True}}, environ={}).enabled
    assert load_config({}, environ={"NIGHTJAR_MEMORY": '{"enabled": true, "mode": "offloaded"}'}).mode == "offloaded"
    f = tmp_path / "m.yaml"
    f.write_text("enabled: true\nbase_blocks: 12\n")
    assert load_config({}, environ={"NIGHTJAR_MEMORY": str(f)}).base_blocks == 12
    with pytest.raises(ValueError, match="NIGHTJAR_MEMORY"):
        load_config({}, environ={"NIGHTJAR_MEMORY": "/nope"})
    with pytest.raises(ValueError, match="mode"):
        load_config({"nightjar_memory": {"mode": "sometimes"}}, environ={})


@pytest.mark.parametrize(("cfg", "device", "pool", "reason"), [
    ({"enabled": True, "allow_unverified_cuda": True}, "cuda", False, None),
    ({"enabled": True}, "cpu", True, "vllm_memory_pool"),
    ({"enabled": True, "release_pages": False}, "cpu", True, None),  # nothing to return: sleep mode may own it
    ({"enabled": False}, "xpu", True, "disabled"),
])
def test_unavailable_reasons(cfg, device, pool, reason):
    assert unavailable_reason(ElasticMemoryConfig(**cfg), device, vllm_memory_pool=pool) == reason


@pytest.mark.parametrize(("device", "enabled", "reason"), [
    ("cpu", True, None), ("cpu", False, "disabled"), ("cuda", True, "cuda_kv_release_unverified"),
    ("xpu", True, "unsupported_device"),
])
def test_offload_asked_for_where_it_cannot_run_serves_with_the_draft_resident(monkeypatch, device, enabled, reason):
    """A GPU pod with offload Auto must start: attach returns no manager (the draft stays resident),
    logs why, and exports the reason; it never raises."""
    from nightjar_worker.memory import manager as mm

    monkeypatch.setenv("NIGHTJAR_MEMORY", json.dumps({"enabled": enabled}))
    monkeypatch.setattr(mm, "find_engine_rpc", lambda: (_ for _ in ()).throw(AssertionError("must not start")))
    cfg = types.SimpleNamespace(additional_config=None, device_config=types.SimpleNamespace(device_type=device))
    assert unavailable_reason(ElasticMemoryConfig(enabled=enabled), device) == reason
    if reason is None:
        with pytest.raises(AssertionError, match="must not start"):
            ElasticMemoryManager.attach_if_enabled(object(), cfg)
        return
    assert ElasticMemoryManager.attach_if_enabled(object(), cfg) is None
    assert reason in UNAVAILABLE_MESSAGES
    assert REGISTRY.get_sample_value("nightjar_memory_offload_enabled", {"reason": reason}) == 0


class GatedArena(HostArena):
    """A host arena whose map does work (as cuMemCreate/cuMemMap do on CUDA) that a gate holds back."""

    map_is_bookkeeping = False

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.gate = threading.Event()
        self.mapped_on: list[str] = []

    def _back(self, a: int, b: int) -> None:
        self.mapped_on.append(threading.current_thread().name)
        assert self.gate.wait(10), "the test never opened the gate"


def test_the_kv_restore_runs_off_the_engine_step_and_the_scheduler_gets_the_blocks_once_mapped(tmp_path):
    m, sched, worker = make(tmp_path, arena_cls=GatedArena, mode="offloaded")
    arena, bp = worker.model_runner.arena, sched.kv_cache_manager.block_pool
    m.on_step(0)
    assert m.sm.state is DraftState.OFFLOADING
    assert wa._agent(worker).mover.task.wait(10)  # the weights are off the device: the restore may start
    t0 = time.perf_counter()
    for _ in range(5):
        d = m.on_step(0)
    assert time.perf_counter() - t0 < 2  # the steps go on while the mapping waits at the gate
    assert m.sm.state is DraftState.OFFLOADING and arena.mapped_on == ["nightjar-kv-restore"]
    assert d.allowed_blocks == BASE - 1 == bp.get_num_free_blocks()  # not one extra block handed out yet
    arena.gate.set()
    d = step_until(m, DraftState.OFFLOADED)
    # each layer's run mapped on that thread: nothing was left for the engine thread to map
    assert arena.mapped_on == ["nightjar-kv-restore"] * len(worker.model_runner.kv_caches)
    assert d.allowed_blocks == BASE - 1 + m.pool.extra == bp.get_num_free_blocks()
    assert arena.is_mapped(0, (BASE + m.pool.extra) * 4096)  # each layer's extra blocks
    assert m.released_bytes == arena.size - arena.mapped_bytes()  # the background bytes were counted
