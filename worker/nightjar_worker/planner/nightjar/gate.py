"""The acceptance gate: no bucket plays gamma > 0 while the draft is almost never accepted.

Acceptance is a property of the draft and the content, not of the batch size, so it is pooled
over all buckets. The pooled counts decay (half-life in steps), so the gate re-opens now and then
and a change of content is noticed.
"""

from __future__ import annotations

import math


class AcceptanceGate:
    __slots__ = ("drafted", "accepted", "min_acceptance", "min_tokens", "decay", "z")

    def __init__(self, *, min_acceptance: float = 0.0, min_tokens: int = 1, halflife_steps: int = 1,
                 z: float = 2.0) -> None:
        """The defaults: a gate that never closes (``configure`` sets the knobs)."""
        self.drafted = 0.0  # draft tokens verified (decaying)
        self.accepted = 0.0
        self.configure(min_acceptance=min_acceptance, min_tokens=min_tokens, halflife_steps=halflife_steps, z=z)

    def configure(self, *, min_acceptance: float, min_tokens: int, halflife_steps: int, z: float) -> None:
        """``min_acceptance`` 0 turns the gate off."""
        self.min_acceptance = min_acceptance
        self.min_tokens = min_tokens
        self.decay = 0.5 ** (1.0 / halflife_steps)
        self.z = z

    def observe(self, drafted: int, accepted: int) -> None:
        self.drafted = self.drafted * self.decay + drafted
        self.accepted = self.accepted * self.decay + accepted

    def closed(self) -> bool:
        """True when the pooled acceptance's upper confidence bound (Wilson, z) over at least
        ``min_tokens`` drafted tokens is below ``min_acceptance``."""
        n = self.drafted
        if self.min_acceptance <= 0 or n < self.min_tokens:
            return False
        p, z2 = min(1.0, self.accepted / n), self.z ** 2
        ucb = (p + z2 / (2 * n) + math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) * math.sqrt(z2)) / (1 + z2 / n)
        return ucb < self.min_acceptance
