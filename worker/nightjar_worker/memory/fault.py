"""Fault injection and retry back-off for draft reloads (pure logic).

``NIGHTJAR_FAULT_RELOAD=n`` makes the next ``n`` reloads in this process fail (read once, when
the injector is created), so the failure path is exercised against a real engine: the worker
must keep serving autoregressively, count the failure and retry with back-off.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the config model needs pydantic; this module does not (the GPU check imports it)
    from nightjar_contract.memory import BackoffConfig

FAULT_ENV = "NIGHTJAR_FAULT_RELOAD"


class InjectedFault(RuntimeError):
    """Raised by the fault-injection hook; handled exactly like a real reload failure."""


class FaultInjector:
    def __init__(self, fail_next_reloads: int = 0) -> None:
        if fail_next_reloads < 0:
            raise ValueError(f"{FAULT_ENV}: must be >= 0 (got {fail_next_reloads})")
        self._left = fail_next_reloads
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> FaultInjector:
        raw = (environ if environ is not None else os.environ).get(FAULT_ENV, "0").strip() or "0"
        try:
            n = int(raw)
        except ValueError as e:
            raise ValueError(f"{FAULT_ENV}: expected a non-negative integer, got {raw!r}") from e
        return cls(n)

    @property
    def remaining(self) -> int:
        return self._left

    def arm(self, n: int) -> None:
        with self._lock:
            self._left = n

    def check_reload(self) -> None:
        """Call at the start of a reload: raises ``InjectedFault`` while armed."""
        with self._lock:
            if self._left > 0:
                self._left -= 1
                raise InjectedFault(f"injected reload failure ({FAULT_ENV}, {self._left} left)")


class RetryBackoff:
    """Exponential back-off: after the k-th consecutive failure wait base * factor^(k-1), capped."""

    def __init__(self, config: BackoffConfig | None = None) -> None:
        if config is None:
            from nightjar_contract.memory import BackoffConfig

            config = BackoffConfig()
        self.config = config
        self.failures = 0
        self.next_allowed_s = float("-inf")

    def allowed(self, now_s: float) -> bool:
        return now_s >= self.next_allowed_s

    def record_failure(self, now_s: float) -> float:
        self.failures += 1
        c = self.config
        delay = min(c.max_s, c.base_s * c.factor ** (self.failures - 1))
        self.next_allowed_s = now_s + delay
        return delay

    def record_success(self) -> None:
        self.failures = 0
        self.next_allowed_s = float("-inf")
