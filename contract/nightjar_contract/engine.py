"""What crosses from vLLM's worker process to the EngineCore with each step (plain dataclasses;
importable without torch or vLLM).

The model-runner hooks (``nightjar_worker.engine.runner_hooks``) fill one ``WorkerStepStats`` per
``sample_tokens`` call and attach it to vLLM's ``ModelRunnerOutput`` as attribute
``WORKER_STATS_ATTR``; vLLM pickles that object to the EngineCore process as is, where
``NightjarScheduler`` reads it back with ``worker_stats``.
"""

from __future__ import annotations

from dataclasses import dataclass

WORKER_STATS_ATTR = "nightjar_stats"
# vLLM's switch between its model runners (vllm/envs.py): "0" selects V1, the runner Nightjar's hooks
# are on (nightjar_worker/engine/hooks.py says why); set by the worker and in every worker pod.
RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
RUNNER_ENV_VALUE = "0"


@dataclass(slots=True)
class WorkerStepStats:
    """What the worker measured during one ``sample_tokens`` call."""

    catchup_s: float = 0.0  # draft KV catch-up time (C_switch of a resume step)
    catchup_tokens: int = 0  # tokens the draft re-processed in that catch-up
    draft_forwards: int = 0  # draft model forward calls (0 at gamma == 0)
    proposed: bool = False  # the draft model proposed for the next step
    draft_lag_tokens: int | None = None  # at gamma == 0: positions the draft lacks before this step
    ngram_k: int = 0  # n-gram drafts proposed after the step's bookkeeping
    hook_ran: bool = False  # the proposal hook ran (vLLM skips it while the draft cannot take the step)
    suffix_k: int = 0  # suffix-tree drafts asked for after the step's bookkeeping (at most, per request)
    suffix_lookups: int = 0  # requests the suffix trees drafted for this step
    suffix_hits: int = 0  # of which with at least one draft token
    suffix_cache_bytes: int | None = None  # suffix trees' memory, on the steps it was measured
    suffix_cached_requests: int | None = None  # outputs in the cross-request suffix tree (None: no trees)


def worker_stats(model_runner_output: object) -> WorkerStepStats | None:
    """The stats the worker attached to a step's output; None if the hooks did not run."""
    stats = getattr(model_runner_output, WORKER_STATS_ATTR, None)
    return stats if isinstance(stats, WorkerStepStats) else None
