"""Reaching the scheduler and model runner of an in-process ``vllm.LLM`` (tests, profiler).

Needs ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` before the ``LLM`` is built: EngineCore and the (single)
worker then live in the caller's process, so the policy can be swapped and step stats read directly.
"""

from __future__ import annotations

from typing import Any


def engine_core(llm: Any) -> Any:
    client = llm.llm_engine.engine_core
    core = getattr(client, "engine_core", None)
    if core is None:
        raise RuntimeError(
            "the LLM's EngineCore runs in another process; set VLLM_ENABLE_V1_MULTIPROCESSING=0 before building it"
        )
    return core


def scheduler(llm: Any) -> Any:
    return engine_core(llm).scheduler


def model_runner(llm: Any) -> Any:
    ex = engine_core(llm).model_executor
    w = getattr(ex, "driver_worker", None)
    w = getattr(w, "worker", w)
    r = getattr(w, "model_runner", None)
    if r is None:
        raise RuntimeError(f"cannot find the model runner of executor {type(ex).__name__}")
    return r


def catchup(llm: Any) -> Any:
    """The runner's ``DraftCatchup`` (None until the first proposing step, or without a draft)."""
    return model_runner(llm).__dict__.get("_nightjar_catchup") or None
