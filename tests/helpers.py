"""Helpers shared by the test modules (tests/ is on sys.path: ``from helpers import wait_for``)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nightjar_operator import constants as c
from nightjar_worker.serve import free_port

__all__ = ["condition", "cr", "free_port", "wait_for"]


def wait_for(cond: Callable[[], Any], timeout: float = 30, what: str = "condition", interval: float = 0.2,
             tolerate: tuple[type[BaseException], ...] = (), proc: subprocess.Popen[Any] | None = None,
             log: Path | None = None) -> Any:
    """Poll ``cond`` until it returns something truthy and return that; an AssertionError naming
    ``what`` and the last value after ``timeout`` s. ``tolerate``: exceptions that count as not yet;
    ``proc``: fail at once if that process exits (with the tail of ``log``)."""
    start = time.monotonic()
    deadline = start + timeout
    last: Any = None
    tail = (lambda: ":\n" + log.read_text()[-3000:]) if log is not None else (lambda: "")
    while time.monotonic() < deadline:
        try:
            last = cond()
        except tolerate as e:
            last = e
        else:
            if last:
                print(f"waited {time.monotonic() - start:5.1f} s for {what}", file=sys.__stderr__)  # visible with -s
                return last
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) while waiting for {what}{tail()}")
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r}){tail()}")


def condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    """The status condition of type ``ctype`` of a resource ({} when absent)."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == ctype:
            return dict(cond)
    return {}


def cr(name: str, **spec: Any) -> dict[str, Any]:
    """A NightjarDeployment with two replicas of a local model pair; ``spec`` overrides top-level fields."""
    body = {
        "target": {"name": "target-1", "source": {"imagePath": "/models/target-1"}},
        "draft": {"name": "draft-1", "source": {"imagePath": "/models/draft-1"}},
        "replicas": 2,
        "image": "example.org/nightjar-worker:1",
        **spec,
    }
    return {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": name}, "spec": body}
