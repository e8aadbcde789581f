"""Fixtures for the planner tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from nightjar_worker.sim.profile import CostProfile

ROOFLINE = Path(__file__).resolve().parents[2] / "benchmarks" / "profiles" / "roofline-h100-7b.json"


@pytest.fixture(scope="session")
def roofline() -> CostProfile:
    return CostProfile.load(ROOFLINE)
