"""Nightjar in vLLM's loop or the engine does not start (``engine/hooks.py``): the runner classes the
hooks are on, the worker's start-up check, the scheduler's checks, and the step record's typed seam.
No engine starts here: vLLM's own classes, the wrapped ``Worker.load_model`` and ``_feedback`` run on
stand-ins for the objects vLLM would pass."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import pytest
from nightjar_contract.engine import WORKER_STATS_ATTR, WorkerStepStats
from nightjar_worker import vllm_plugin
from nightjar_worker.engine import hooks
from nightjar_worker.engine.scheduler import InflightStep, NightjarScheduler


@pytest.fixture(scope="module", autouse=True)
def installed() -> None:
    vllm_plugin.register()  # what vLLM's plugin loader runs in every process


def test_the_cpu_runner_carries_every_hook():
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert hooks.runner_problem(GPUModelRunner) is None
    assert hooks.runner_problem(CPUModelRunner) is None


def test_the_cpu_runners_own_initialize_kv_cache_delegates_to_the_hook():
    """The one override allowed to shadow a hook must still call it (read in the installed vLLM)."""
    import importlib

    for qualname, meth in hooks.DELEGATING_OVERRIDES:
        module, cls = qualname.rsplit(".", 1)
        src = inspect.getsource(getattr(getattr(importlib.import_module(module), cls), meth))
        assert f"super().{meth}(" in src


def test_model_runner_v2_is_refused_naming_the_switch():
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2

    problem = hooks.runner_problem(V2)
    assert problem is not None and "VLLM_USE_V2_MODEL_RUNNER=0" in problem and "vllm.v1.worker.gpu.model_runner" in problem


def test_a_runner_overriding_a_hook_is_refused():
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    class Custom(CPUModelRunner):
        def sample_tokens(self, grammar_output: Any) -> Any:  # skips Nightjar's hook
            return None

    problem = hooks.runner_problem(Custom)
    assert problem is not None and "Custom.sample_tokens overrides" in problem


def test_unhooked_runner_methods_are_refused(monkeypatch: pytest.MonkeyPatch):
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    monkeypatch.setattr(GPUModelRunner, "propose_draft_token_ids", GPUModelRunner.propose_draft_token_ids.__wrapped__)
    problem = hooks.runner_problem(GPUModelRunner)
    assert problem is not None and "propose_draft_token_ids is not hooked" in problem


def nightjar_config(**kw: Any) -> SimpleNamespace:
    spec = SimpleNamespace(uses_draft_model=lambda: True, method="draft_model")
    sched = SimpleNamespace(scheduler_cls="nightjar_worker.engine.scheduler.NightjarScheduler")
    return SimpleNamespace(speculative_config=spec, scheduler_config=sched, **kw)


def test_a_worker_whose_runner_lacks_the_hooks_does_not_load_its_model():
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2
    from vllm.v1.worker.gpu_worker import Worker

    assert hooks.is_hook(Worker.load_model)
    loaded: list[bool] = []
    runner = object.__new__(V2)
    runner.load_model = lambda **_: loaded.append(True)  # type: ignore[attr-defined]
    worker = SimpleNamespace(vllm_config=nightjar_config(), model_runner=runner)
    with pytest.raises(hooks.NightjarNotInLoop, match="refusing to start.*V2"):
        Worker.load_model(worker)  # type: ignore[arg-type]
    assert loaded == []


def test_the_check_applies_to_nightjar_engines_only():
    """vLLM's own scheduler (baselines) and the NIGHTJAR_ENGINE=0 escape hatch are left alone."""
    assert hooks.nightjar_enabled(nightjar_config())
    cfg = nightjar_config()
    cfg.scheduler_config.scheduler_cls = "vllm.v1.core.sched.scheduler.Scheduler"
    assert not hooks.nightjar_enabled(cfg)
    cfg = nightjar_config()
    cfg.speculative_config.uses_draft_model = lambda: False  # n-gram only: no draft, no runner hooks needed
    assert not hooks.nightjar_enabled(cfg)
    from nightjar_worker.engine.scheduler import NightjarScheduler

    class Renamed(NightjarScheduler):  # a subclass of ours under another name
        pass

    cfg = nightjar_config()
    cfg.scheduler_config.scheduler_cls = Renamed
    assert hooks.nightjar_enabled(cfg)


def test_the_scheduler_refuses_a_v2_configuration():
    assert hooks.config_problem(nightjar_config(use_v2_model_runner=False)) is None
    with pytest.raises(hooks.NightjarNotInLoop, match="VLLM_USE_V2_MODEL_RUNNER=0"):
        hooks.require(hooks.config_problem(nightjar_config(use_v2_model_runner=True)))


# --- the step record: what crosses from the worker, typed -------------------------------------------


class Observed:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def observe(self, rec: Any) -> None:
        self.records.append(rec)


def scheduler_stub(record_per_request: bool) -> NightjarScheduler:
    s = object.__new__(NightjarScheduler)
    s.record_per_request = record_per_request
    s.request_acceptance = {}
    s.requests = {"r1": SimpleNamespace(prompt_token_ids=[5, 6, 7])}
    s._hooks_required = True
    s.nightjar_step = 0
    s.nightjar_control = Observed()
    return s


def step_output(stats: WorkerStepStats | None) -> tuple[InflightStep, Any, Any]:
    so = SimpleNamespace(num_scheduled_tokens={"r1": 3}, scheduled_spec_decode_tokens={"r1": [1, 2]})
    mro = SimpleNamespace(sampled_token_ids=[[4, 9]], req_id_to_index={"r1": 0})
    if stats is not None:
        setattr(mro, WORKER_STATS_ATTR, stats)
    return InflightStep(so, 0.0, 2, 1, 1e-6, 40, "draft", "draft"), so, mro


@pytest.mark.parametrize("record_per_request", [False, True])
def test_the_step_record_carries_the_decision_prompt_estimate(record_per_request: bool):
    """With per-request recording on (the profiler) the record's decide_prompt_tokens was the
    request's prompt token ids, not the step's estimate (a local name reused)."""
    s = scheduler_stub(record_per_request)
    step, so, mro = step_output(WorkerStepStats(catchup_s=0.25, catchup_tokens=7, draft_forwards=3, draft_lag_tokens=None))
    s._feedback(step, 1.0, so, mro)
    (rec,) = s.nightjar_control.records
    assert rec.decide_prompt_tokens == 40
    assert (rec.switch_cost_s, rec.catchup_tokens, rec.draft_forwards, rec.draft_lag_tokens) == (0.25, 7, 3, None)
    assert rec.step_time_s == pytest.approx(0.75)
    assert (rec.tokens_emitted, rec.num_draft_tokens, rec.num_accepted_tokens) == (2, 2, 1)
    if record_per_request:
        assert s.request_acceptance["r1"] == [(5, 6, 7), 2, 1]


def test_a_step_without_the_workers_stats_stops_the_engine():
    s = scheduler_stub(False)
    step, so, mro = step_output(None)
    with pytest.raises(hooks.NightjarNotInLoop, match="hooks did not run"):
        s._feedback(step, 1.0, so, mro)
