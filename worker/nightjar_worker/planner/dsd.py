"""Baseline: DSD / SmartSpec-style goodput maximiser.

Keeps a moving average of the per-token acceptance rate alpha (inverted from the accepted-token
counts under the geometric model) and a profiled latency model T(batch, gamma) (the CostProfile),
and picks the gamma maximising expected tokens per second: batch * E[tokens | gamma, alpha] / T.
It ignores switching costs (as those systems do).
"""

from __future__ import annotations

from nightjar_contract.planner import PlannerConfig

from nightjar_worker.planner.policy import StepFeedback
from nightjar_worker.sim.profile import CostProfile, expected_tokens


def invert_acceptance(mean_accepted: float, gamma: int) -> float:
    """alpha such that sum_{i=1..gamma} alpha^i == mean_accepted (bisection)."""
    if mean_accepted <= 0:
        return 0.0
    if mean_accepted >= gamma:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        if expected_tokens(gamma, mid) - 1.0 < mean_accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


class DSDPolicy:
    """Goodput maximiser over a profiled latency model with EMA acceptance."""

    name = "dsd"

    def __init__(self, config: PlannerConfig, profile: CostProfile, ema: float = 0.05) -> None:
        self._arms = config.resolved_arms()
        self.profile = profile
        self.ema = ema
        self.alpha = profile.alpha()
        self._cache_alpha = -1.0
        self._cache: dict[int, int] = {}

    @property
    def arms(self) -> tuple[int, ...]:
        return self._arms

    def decide(self, batch_size: int, prompt_tokens: int = 0) -> int:
        b = max(1, batch_size)
        if abs(self.alpha - self._cache_alpha) > 0.005:
            self._cache.clear()
            self._cache_alpha = self.alpha
        g = self._cache.get(b)
        if g is None:
            a = self._cache_alpha
            g = max(self._arms, key=lambda k: expected_tokens(k, a) / self.profile.step_time(b, k))
            self._cache[b] = g
        return g

    def observe(self, feedback: StepFeedback) -> None:
        fb = feedback
        if fb.gamma <= 0 or fb.num_draft_tokens <= 0:
            return
        requests = fb.num_draft_tokens / fb.gamma
        a = invert_acceptance(fb.num_accepted_tokens / requests, fb.gamma)
        self.alpha += self.ema * (a - self.alpha)
