"""Baseline: no speculative decoding (gamma = 0 on every step)."""

from __future__ import annotations

from nightjar_worker.planner.policy import StepFeedback


class NoSDPolicy:
    """Always a plain autoregressive step."""

    name = "nosd"

    def __init__(self) -> None:
        self._arms = (0,)

    @property
    def arms(self) -> tuple[int, ...]:
        return self._arms

    def decide(self, batch_size: int, prompt_tokens: int = 0) -> int:
        return 0

    def observe(self, feedback: StepFeedback) -> None:
        return None
