"""Baseline: BanditSpec-style UCB1 over gamma, without context (the batch size is ignored).

Reward of a step: its throughput (tokens per second) normalised by the largest seen so far, so
rewards lie in (0, 1]. Arms are tried once each, then argmax mean + sqrt(2 ln t / n).
"""

from __future__ import annotations

import math

from nightjar_contract.planner import PlannerConfig

from nightjar_worker.planner.policy import StepFeedback


class UCBPolicy:
    """Context-free UCB1."""

    name = "ucb"

    def __init__(self, config: PlannerConfig, c: float = 1.0) -> None:
        self._arms = config.resolved_arms()
        self._idx = {g: i for i, g in enumerate(self._arms)}
        self._n = [0] * len(self._arms)
        self._raw = [0.0] * len(self._arms)  # sums of raw throughput
        self._max = 0.0
        self._t = 0
        self.c = c

    @property
    def arms(self) -> tuple[int, ...]:
        return self._arms

    def decide(self, batch_size: int, prompt_tokens: int = 0) -> int:
        for i, n in enumerate(self._n):
            if n == 0:
                return self._arms[i]
        log_t = math.log(max(self._t, 1))
        top = self._max
        best = max(
            range(len(self._arms)),
            key=lambda i: self._raw[i] / (self._n[i] * top) + self.c * math.sqrt(2 * log_t / self._n[i]),
        )
        return self._arms[best]

    def observe(self, feedback: StepFeedback) -> None:
        i = self._idx.get(feedback.gamma)
        if i is None:
            return
        r = max(1, feedback.tokens_emitted) / max(feedback.step_time_s + feedback.switch_cost_s, 1e-12)
        self._max = max(self._max, r)
        self._n[i] += 1
        self._raw[i] += r
        self._t += 1
