"""Helpers shared by the test modules (tests/ is on sys.path: ``from helpers import wait_for``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nightjar_operator import constants as c
from nightjar_worker.serve import free_port

__all__ = ["condition", "cr", "free_port", "upstream_schema_errors", "wait_for"]

K8S_MODELS = Path(os.environ.get("CACHE", Path.home() / ".cache/nightjar")) / "k8s-models"


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


def upstream_schema_errors(objs: list[dict[str, Any]]) -> list[str]:
    """One line per object from the upstream-derived schemas of third-party kinds (KEDA, Gateway
    API: the kubernetes-models npm packages that ``make k8s-models`` installs): "ok" or what is wrong."""
    import pytest

    if not (K8S_MODELS / "node_modules").is_dir() or not shutil.which("node"):
        pytest.fail(f"the KEDA / Gateway API schemas are missing in {K8S_MODELS}: run `make k8s-models`", pytrace=False)
    p = subprocess.run(["node", str(K8S_MODELS / "validate.mjs")], input=json.dumps(objs), capture_output=True,
                       text=True, timeout=60, check=True)  # fmt: skip
    return p.stdout.splitlines()
