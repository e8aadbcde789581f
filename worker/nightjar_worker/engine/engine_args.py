"""vLLM engine keyword arguments for a Nightjar draft/target pair (``LLM(**kw)`` or ``EngineArgs(**kw)``).

Checks the vLLM version and the pair's tokenizers before vLLM starts (errors name both models).
``async_scheduling=False``: Nightjar's scheduler and runner hooks are the synchronous path (the CPU
platform forces it anyway; CUDA builds would otherwise default to the async scheduler).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from nightjar_worker.engine.pair_check import check_pair
from nightjar_worker.engine.version import check_vllm_version

NIGHTJAR_SCHEDULER_CLS = "nightjar_worker.engine.scheduler.NightjarScheduler"
DTYPES = ("bfloat16", "float32", "float16", "auto")  # what serve and profile accept as --dtype


def speculative_config(draft: str | os.PathLike[str], k: int, **extra: Any) -> dict[str, Any]:
    if k < 1:
        raise ValueError(f"num_speculative_tokens: K must be >= 1 for a draft (got {k})")
    return {"method": "draft_model", "model": os.fspath(draft), "num_speculative_tokens": k, **extra}


def engine_kwargs(
    target: str | os.PathLike[str],
    draft: str | os.PathLike[str] | None,
    k: int = 4,
    *,
    nightjar: bool = True,
    max_model_len: int = 1024,
    dtype: str = "bfloat16",
    **extra: Any,
) -> dict[str, Any]:
    """``nightjar=False`` gives the same engine with vLLM's own scheduler (baselines)."""
    check_vllm_version()
    t = Path(target)
    if not (t / "config.json").is_file():
        raise FileNotFoundError(f"model: {t} is not a model directory (run `make models`)")
    kw: dict[str, Any] = {
        "model": str(t),
        "dtype": dtype,
        "enforce_eager": True,
        "max_model_len": max_model_len,
        "async_scheduling": False,
    }
    if draft is not None:
        d = Path(draft)
        if not (d / "config.json").is_file():
            raise FileNotFoundError(f"speculative_config.model: {d} is not a model directory (run `make models`)")
        check_pair(t, d)
        kw["speculative_config"] = speculative_config(d, k)
        if nightjar:
            kw["scheduler_cls"] = NIGHTJAR_SCHEDULER_CLS
    kw.update(extra)
    return kw
