"""How many prompt tokens the next step will prefill, estimated before vLLM schedules it.

The gamma policy decides before ``Scheduler.schedule()`` (gamma limits the step's verification, so
the scheduler needs it), yet a running draft prefills every prompt token the step admits: the
planner prices that per step (``PlannerConfig.step_prefill_price``). This walks the queues the way
vLLM's scheduler admits work: running requests first (a partly prefilled prompt continues as a
chunk, a decoding one takes a token), then waiting ones in queue order while batch slots and the
token budget last. It counts the positions each prefilling request computes less the one that
samples its first token, as ``StepFeedback.prefill_tokens`` does; ``cached(request)`` gives a
waiting request's prefix-cache hit (the scheduler's lookup). It cannot see a KV cache too full to
admit, so it over-estimates then; the step log records both figures. Duck-typed on vLLM's
``Request`` (``num_tokens``, ``num_computed_tokens``): no vllm import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


def pending_prompt_tokens(
    running: Iterable[Any], waiting: Iterable[Any], max_seqs: int, token_budget: int,
    cached: Callable[[Any], int] | None = None,
) -> int:
    """Prompt tokens the next step is expected to prefill (see the module docstring)."""
    budget, total, seqs = token_budget, 0, 0
    for queue, admitting in ((running, False), (waiting, True)):
        for req in queue:
            if budget <= 0 or (admitting and seqs >= max_seqs):
                return total
            seqs += 1
            left = req.num_tokens - req.num_computed_tokens
            if admitting and cached is not None:
                left -= cached(req)
            take = min(max(left, 1), budget)
            budget -= take
            if left > 1:
                total += take - 1
    return total
