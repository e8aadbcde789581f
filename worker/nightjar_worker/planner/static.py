"""Baseline: a fixed speculation length k on every step (vLLM's num_speculative_tokens), from the
draft model or, with ``source="ngram"``, from prompt lookup (vLLM's ngram method)."""

from __future__ import annotations

from nightjar_worker.planner.policy import StepFeedback


class StaticPolicy:
    """Always gamma = k."""

    def __init__(self, gamma: int, arms: tuple[int, ...] | None = None, source: str = "draft") -> None:
        if gamma < 0:
            raise ValueError(f"static_gamma: must be >= 0 (got {gamma})")
        self.gamma = gamma
        self._source = source
        self.name = f"static-{gamma}" if source == "draft" else f"static-{source}-{gamma}"
        self._arms = arms if arms is not None else tuple(range(gamma + 1))
        if gamma not in self._arms:
            raise ValueError(f"static_gamma: {gamma} is not one of the arms {self._arms}")

    @property
    def arms(self) -> tuple[int, ...]:
        return self._arms

    def decide(self, batch_size: int, prompt_tokens: int = 0) -> int:
        return self.gamma

    def source(self) -> str:
        return self._source

    def needs_draft(self) -> bool:
        """Whether the draft model must be resident (its KV blocks taken from the cache)."""
        return self.gamma > 0 and self._source == "draft"

    def observe(self, feedback: StepFeedback) -> None:
        return None
