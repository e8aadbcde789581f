"""Shared fixtures for engine tests: ONE in-process Nightjar engine per module (starting vLLM is the
expensive part), on the bundled target used as its own draft (deterministic 100% greedy
acceptance), plus reference outputs from a plain engine without speculation.

Module scope, not session: ``engine_env`` sets test-only knobs (``NIGHTJAR_FORCE_GAMMA``...) in
``os.environ``; held until the session ends they leaked into every worker subprocess started by
later test directories (serve, fleet), which then ran a forced schedule instead of the planner."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from typing import Any

import pytest
from engine_helpers import (
    LOSSLESS_MAX_TOKENS,
    MAX_MODEL_LEN,
    K,
    StepRecorder,
    generate_margins,
    prompts,
    require_models,
)


@pytest.fixture(scope="module")
def engine_env() -> Iterator[None]:
    keys = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "NIGHTJAR_FORCE_GAMMA": "0",
        "NIGHTJAR_CONFIG_POLL_S": "0",
    }
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    os.environ.pop("NIGHTJAR_STEP_LOG", None)
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def reference_outputs(engine_env: None) -> dict[str, tuple[list[int], list[float]]]:
    """Plain decoding (vLLM's scheduler, no speculative_config) for the lossless prompts: the ids
    and the top-2 margin at each position (``lossless_mismatch``)."""
    from vllm import LLM

    target, _ = require_models()
    llm = LLM(model=target, dtype="bfloat16", enforce_eager=True, max_model_len=MAX_MODEL_LEN,
              max_num_seqs=8, enable_prefix_caching=False, seed=0)
    texts = prompts()
    out = generate_margins(llm, texts, LOSSLESS_MAX_TOKENS)
    del llm
    gc.collect()
    return dict(zip(texts, out, strict=True))


@pytest.fixture(scope="module")
def nightjar_llm(engine_env: None, reference_outputs: dict) -> Iterator[Any]:
    """The Nightjar engine: target drafting for itself, K=3, policy swapped per test."""
    from nightjar_worker.engine.engine_args import engine_kwargs
    from vllm import LLM

    target, _ = require_models()
    llm = LLM(**engine_kwargs(target, target, k=K, max_model_len=MAX_MODEL_LEN, max_num_seqs=8,
                              enable_prefix_caching=False, seed=0))
    yield llm
    del llm
    gc.collect()


@pytest.fixture()
def steps() -> Iterator[StepRecorder]:
    from nightjar_worker.engine.control import add_step_listener, remove_step_listener

    rec = StepRecorder()
    add_step_listener(rec)
    yield rec
    remove_step_listener(rec)
