"""Chart test helpers: locate the real helm binary (``make helm``), render the chart, look objects up."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "nightjar"
VALUES_DIR = Path(__file__).parent / "values"
INVALID_DIR = Path(__file__).parent / "invalid-values"
HELM_DEFAULT = Path.home() / ".cache" / "nightjar" / "bin" / "helm"


def helm_path() -> str | None:
    env = os.environ.get("HELM")
    if env and Path(env).is_file():
        return env
    if HELM_DEFAULT.is_file():
        return str(HELM_DEFAULT)
    return shutil.which("helm")


class Rendered(list):
    """The objects of one `helm template` run, with lookups."""

    def kinds(self) -> list[str]:
        return sorted(o["kind"] for o in self)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [o for o in self.of(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, got {[o['metadata']['name'] for o in found]}"
        return found[0]


def run_helm(helm: str, *args: str, check: bool = True, env: dict[str, str] | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([helm, *args], capture_output=True, text=True, env=env, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def render(helm: str, values: Sequence[Path] = (), sets: Sequence[str] = (), api_versions: Sequence[str] = (),
           namespace: str = "nightjar-system", release: str = "nightjar", extra: Sequence[str] = ()) -> Rendered:
    args = ["template", release, str(CHART), "--namespace", namespace]
    for v in values:
        args += ["-f", str(v)]
    for s in sets:
        args += ["--set", s]
    for a in api_versions:
        args += ["--api-versions", a]
    out = run_helm(helm, *args, *extra).stdout
    return Rendered(d for d in yaml.safe_load_all(out) if d)


def values_files() -> list[Path]:
    return sorted(VALUES_DIR.glob("*.yaml"))
