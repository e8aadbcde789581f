"""Chart tests: the real helm binary (``make helm`` puts it at ~/.cache/nightjar/bin/helm)."""

from __future__ import annotations

import pytest
from helmutil import helm_path


@pytest.fixture(scope="session")
def helm() -> str:
    path = helm_path()
    if path is None:
        pytest.fail("helm not found: run `make helm` (puts it at ~/.cache/nightjar/bin/helm); `make test` does it",
                    pytrace=False)
    return path
