"""The step log: every step's record (``StepFeedback``) as a JSON line, and reading it back."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict
from typing import Any

from nightjar_worker.planner.policy import StepFeedback


def to_json(rec: StepFeedback) -> str:
    return json.dumps(asdict(rec))


def from_dict(d: dict[str, Any]) -> StepFeedback:
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
