"""Helpers shared by the operator tests (the cluster fixtures live in tests/conftest.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

BASE_SPEC: dict[str, Any] = {
    "target": {"name": "Qwen2.5-Coder-1.5B-Instruct", "source": {"pvc": {"claimName": "models", "path": "target"}}},
    "draft": {"name": "Qwen2.5-Coder-0.5B-Instruct", "source": {"pvc": {"claimName": "models", "path": "draft"}}},
    "replicas": 2,
    "image": "example.org/nightjar-worker:1",
}


@pytest.fixture
def raw_spec() -> dict[str, Any]:
    return copy.deepcopy(BASE_SPEC)
