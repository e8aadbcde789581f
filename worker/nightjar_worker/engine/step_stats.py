"""One record per decoding step (plain dataclass, vLLM style), plus its JSONL sink.

Step time is measured in the EngineCore from the start of ``Scheduler.schedule()`` to the start of
``Scheduler.update_from_output()`` for the same step: on the synchronous CPU engine that spans
scheduling, the target forward (verification), sampling and the draft proposal for the next step,
and excludes idle time between steps. ``catchup_s`` (draft KV catch-up, measured in the worker) is
reported separately as C_switch and subtracted from ``step_time_s``.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass


@dataclass(slots=True)
class StepStats:
    step: int
    batch_size: int  # the policy's context: running + waiting requests (capped at max_num_seqs) when gamma was decided
    num_reqs: int  # requests scheduled this step
    gamma: int  # decided gamma (drafts proposed for the next step; verification trimmed to it)
    step_time_s: float  # wall time of the step, catch-up excluded
    tokens_emitted: int  # tokens generated for the whole batch (accepted drafts + bonus/AR token)
    num_draft_tokens: int  # drafts verified this step
    num_accepted_tokens: int
    catchup_s: float = 0.0  # draft KV catch-up time (C_switch), charged to this step
    catchup_tokens: int = 0  # tokens the draft re-processed in the catch-up
    draft_forwards: int = 0  # draft model forward calls in this step (0 at gamma == 0)
    num_prefill_tokens: int = 0  # scheduled tokens of requests still prefilling
    decide_prompt_tokens: int = 0  # the estimate of num_prefill_tokens the policy decided with
    draft_lag_tokens: int = -1  # gamma == 0: positions of running requests the draft lacks (-1: unknown)
    decide_s: float = 0.0  # policy.decide wall time
    time: float = 0.0  # unix time at the end of the step

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class JsonlSink:
    """Appends StepStats as JSON lines (env ``NIGHTJAR_STEP_LOG``); line-buffered, thread-safe."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._f = open(self.path, "a", buffering=1)  # noqa: SIM115 - closed in close()

    def __call__(self, stats: StepStats) -> None:
        with self._lock:
            self._f.write(stats.to_json() + "\n")

    def close(self) -> None:
        with self._lock:
            self._f.close()


def read_jsonl(path: str | os.PathLike[str]) -> list[StepStats]:
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.append(StepStats(**json.loads(line)))
    return out
