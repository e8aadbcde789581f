"""The real node for the end-to-end tests: the control plane of ``tests/conftest.py`` plus a kubelet,
kube-proxy and containerd (``LocalCluster(kubelet=True)``), with the project's images imported.

Needs root and what ``make e2e`` prepares (binaries, runtime packages, images, helm, Prometheus);
a missing piece fails the test with the command that provides it.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMINGS = ROOT / "build" / "e2e-timings.json"


@pytest.fixture(scope="module")
def node():
    from nightjar_operator.testing import kubelet_node
    from nightjar_operator.testing.cluster import BIN_DIR, PROJECT_IMAGES, LocalCluster, missing_binaries

    why = kubelet_node.can_run()
    if why:
        pytest.fail(f"the end-to-end tests run pods on a real kubelet: {why}", pytrace=False)
    missing = missing_binaries() + kubelet_node.missing(BIN_DIR)
    if missing:
        pytest.fail(f"the real node needs {', '.join(missing)}: run `make e2e` (it builds and installs them)", pytrace=False)
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus not found: run `make prometheus`", pytrace=False)
    t0 = time.monotonic()
    cluster = LocalCluster(kubelet=True).start()
    try:
        assert cluster.node is not None
        started = time.monotonic() - t0
        imported = cluster.node.import_images(list(PROJECT_IMAGES))
        cluster.timings["images_import_s"] = time.monotonic() - t0 - started
        cluster.timings["images_imported"] = sorted(imported)  # type: ignore[assignment]
        yield cluster
    finally:
        cluster.stop()


class Timings:
    """Seconds per step of the journey, written to build/e2e-timings.json."""

    def __init__(self) -> None:
        self.steps: dict[str, float] = {}
        self.extra: dict = {}
        self._t = time.monotonic()

    def lap(self, step: str) -> float:
        now = time.monotonic()
        self.steps[step] = round(now - self._t, 1)
        self._t = now
        return self.steps[step]

    def note(self, key: str, value) -> None:
        self.extra[key] = value

    def save(self, extra: dict) -> None:
        TIMINGS.parent.mkdir(exist_ok=True)
        TIMINGS.write_text(json.dumps({**extra, **self.extra, **self.steps}, indent=1))


@pytest.fixture(scope="module")
def timings():
    TIMINGS.unlink(missing_ok=True)
    t = Timings()
    yield t
