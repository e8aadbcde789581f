"""No import cycle inside the operator or the worker, function-level imports counted: a cycle
hidden in a function still couples the modules both ways (and imports in a surprising order)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def modules(src: Path, package: str) -> dict[str, Path]:
    out = {}
    for p in (src / package).rglob("*.py"):
        name = ".".join(p.relative_to(src).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of ``known`` that ``name`` imports anywhere in its body. ``from pkg import sub`` counts
    as importing ``pkg.sub`` only (a submodule always runs its package's __init__; that is no cycle)."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            targets.update(subs if len(subs) == len(node.names) else [base, *subs])
    out = set()
    for t in targets:
        while t and t not in known:
            t = t.rpartition(".")[0]
        if t and t != name:
            out.add(t)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize(("src", "package"), [("operator", "nightjar_operator"), ("worker", "nightjar_worker"),
                                              ("contract", "nightjar_contract")])
def test_no_import_cycles(src, package):
    mods = modules(ROOT / src, package)
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    assert cycles(graph) == []


def top_level_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize(("src", "package", "forbidden"), [
    ("contract", "nightjar_contract", {"nightjar_worker", "nightjar_operator", "torch", "vllm", "kopf", "kubernetes"}),
    ("operator", "nightjar_operator", {"nightjar_worker", "torch", "vllm"}),
])
def test_package_boundaries(src, package, forbidden):
    """The contract stands alone; the operator talks to the worker only through it."""
    bad = {name: sorted(top_level_imports(path) & forbidden) for name, path in modules(ROOT / src, package).items()
           if top_level_imports(path) & forbidden}
    assert bad == {}


def test_the_walker_sees_a_cycle_hidden_in_a_function(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from p import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import thing\n")
    mods = modules(tmp_path, "p")
    graph = {n: imports(n, p, set(mods)) for n, p in mods.items()}
    assert cycles(graph) == [["p.a", "p.b"]]
