"""The docs cite what the tree keeps: figures and result folders exist, and no commit hashes (the
history is CHANGELOG.md's, by date)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md", REPO / "CHANGELOG.md"]
# 7-40 hex digits with at least one letter and one digit: a commit hash, not a number or a word
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def test_no_commit_hashes_in_the_docs():
    hits = [f"{p.relative_to(REPO)}:{i}: {line.strip()[:80]}" for p in DOCS
            for i, line in enumerate(p.read_text().splitlines(), 1) if HASH.search(line)]
    assert not hits, "history goes to CHANGELOG.md, dated:\n" + "\n".join(hits)


def test_every_figure_and_result_folder_the_docs_cite_exists():
    missing = []
    for p in DOCS:
        text = p.read_text()
        for ref in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
            if not (p.parent / ref).resolve().is_file():
                missing.append(f"{p.name}: figure {ref}")
        for ref in re.findall(r"benchmarks/results/[A-Za-z0-9_./-]*(?:\{[^}]*\})?", text):
            head, _, alts = ref.partition("{")  # warmstart.{json,png}: each one
            paths = [head + alt for alt in alts.rstrip("}").split(",")] if alts else [ref.rstrip(".")]
            missing += [f"{p.name}: {x}" for x in paths if not (REPO / x).exists()]
    assert not missing, "\n".join(missing)
