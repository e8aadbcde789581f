"""Baseline: a static batch-size -> gamma table.

Same semantics as vLLM 0.32's ``num_speculative_tokens_per_batch_size``: the gamma of a step is the
table value of the largest key <= the batch size; below the smallest key, the smallest key's value.
"""

from __future__ import annotations

import bisect

from nightjar_worker.planner.policy import StepFeedback


class TablePolicy:
    """Looks the batch size up in a fixed table; never learns."""

    name = "table"

    def __init__(self, table: dict[int, int], arms: tuple[int, ...]) -> None:
        if not table:
            raise ValueError("gamma_table: must not be empty")
        self._keys = sorted(table)
        self._vals = [table[k] for k in self._keys]
        bad = [g for g in self._vals if g not in arms]
        if bad:
            raise ValueError(f"gamma_table: gammas {bad} are not among the arms {arms}")
        self._arms = arms

    @property
    def arms(self) -> tuple[int, ...]:
        return self._arms

    def decide(self, batch_size: int, prompt_tokens: int = 0) -> int:
        i = bisect.bisect_right(self._keys, batch_size) - 1
        return self._vals[max(i, 0)]

    def observe(self, feedback: StepFeedback) -> None:
        return None
