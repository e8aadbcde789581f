"""The planner and the simulator are pure Python: no torch or vllm anywhere under them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import nightjar_worker

PKG = Path(nightjar_worker.__file__).resolve().parent
HEAVY = {"torch", "vllm"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "__import__":
            out |= {a.value.split(".")[0] for a in node.args if isinstance(a, ast.Constant)}
    return out


def test_no_torch_or_vllm_in_source():
    files = sorted((PKG / "planner").rglob("*.py")) + sorted((PKG / "sim").rglob("*.py"))
    assert len(files) >= 10
    bad = {str(f.relative_to(PKG)): sorted(_imports(f) & HEAVY) for f in files if _imports(f) & HEAVY}
    assert not bad, bad


def test_importing_planner_and_sim_loads_neither():
    code = (
        "import sys, nightjar_worker.planner as p, nightjar_worker.sim as s\n"
        "import nightjar_worker.planner.nightjar, nightjar_worker.planner.dsd, nightjar_worker.planner.ucb\n"
        "import nightjar_worker.planner.oracle, nightjar_worker.sim.simulator, nightjar_worker.sim.regret\n"
        "import nightjar_worker.sim.roofline, nightjar_worker.sim.workload\n"
        "print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
