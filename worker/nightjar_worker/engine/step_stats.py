"""The step log: every step's record (``StepFeedback``) as a JSON line, and reading it back.

Logs written before the record was unified used the engine's own field names (``catchup_s``,
``num_prefill_tokens``, ``-1``/``0`` for unknown lag and catch-up tokens); ``read_jsonl`` reads
both, so committed benchmark logs stay readable.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict
from typing import Any

from nightjar_worker.planner.policy import StepFeedback

_RENAMED = {"catchup_s": "switch_cost_s", "num_prefill_tokens": "prefill_tokens"}


def to_json(rec: StepFeedback) -> str:
    return json.dumps(asdict(rec))


def from_dict(d: dict[str, Any]) -> StepFeedback:
    """A record from a log line, old field names included."""
    legacy = "catchup_s" in d
    d = {_RENAMED.get(k, k): v for k, v in d.items()}
    if legacy:
        if d.get("draft_lag_tokens", -1) < 0:
            d["draft_lag_tokens"] = None
        if d.get("switch_cost_s", 0.0) <= 0:
            d["catchup_tokens"] = None
    return StepFeedback(**d)


class JsonlSink:
    """Appends records as JSON lines (env ``NIGHTJAR_STEP_LOG``); line-buffered, thread-safe."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._f = open(self.path, "a", buffering=1)  # noqa: SIM115 - closed in close()

    def __call__(self, rec: StepFeedback) -> None:
        with self._lock:
            self._f.write(to_json(rec) + "\n")

    def close(self) -> None:
        with self._lock:
            self._f.close()


def read_jsonl(path: str | os.PathLike[str]) -> list[StepFeedback]:
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.append(from_dict(json.loads(line)))
    return out
