"""Shared fixtures of the serve tests (no engine starts here)."""

from __future__ import annotations

import pytest


@pytest.fixture
def pair(tmp_path, monkeypatch):
    t, d = tmp_path / "target", tmp_path / "draft"
    for p in (t, d):
        p.mkdir()
        (p / "config.json").write_text("{}")
    cfg = tmp_path / "nightjar.yaml"
    cfg.write_text("planner: {max_gamma: 3}\n")
    monkeypatch.setenv("NIGHTJAR_CONFIG", str(cfg))
    monkeypatch.setenv("NIGHTJAR_MODEL", str(t))
    monkeypatch.setenv("NIGHTJAR_DRAFT", str(d))
    return t, d
