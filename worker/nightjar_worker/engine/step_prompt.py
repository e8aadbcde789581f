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
``Request`` (``num_tokens``, ``num_computed_tokens``, ``arrival_time``, ``num_output_tokens``): no
vllm import.

The same walk, carried on over the prompt steps that follow (the step's token budget less one
token per decoding request, batch slots that free up only as prompts are admitted), gives the
queue a ``QueueAware`` policy is told: each prompt still waiting for its first token, its wait so
far and the prompt steps before the one that completes it. It stops where admission waits on a
slot (that depends on requests finishing) or after ``horizon`` steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from nightjar_worker.planner.policy import QueuedPrompt


@dataclass(frozen=True, slots=True)
class PrefillPlan:
    """The next step's expected prefill and the prompts waiting for their first token."""

    prompt_tokens: int
    queue: tuple[QueuedPrompt, ...]


def plan_prefill(
    running: Iterable[Any], waiting: Iterable[Any], max_seqs: int, token_budget: int,
    cached: Callable[[Any], int] | None = None, now: float = 0.0, horizon: int = 16, limit: int = 64,
) -> PrefillPlan:
    """Walk the queues as the scheduler admits them (see the module docstring). Decoding requests
    take one token each before the prompts (the scheduler interleaves them: it matters only when
    the budget runs out among the running requests)."""

    def state(req: Any, left: int) -> list[Any]:
        # [wait_s, prompt positions left to compute, first token not yet out]
        return [now - getattr(req, "arrival_time", now), left, getattr(req, "num_output_tokens", 0) == 0]

    decoding, active = 0, []
    for r in running:
        left = r.num_tokens - r.num_computed_tokens
        if left > 1:
            active.append(state(r, left))
        else:
            decoding += 1
    seats = max_seqs - decoding - len(active)
    queue = iter(waiting)
    first, out = 0, []
    for step in range(horizon):
        budget, total, still = token_budget - decoding, 0, []
        pending = iter(active)
        while budget > 0:
            a = next(pending, None)
            if a is None:  # the running prompts all scheduled: admit waiting ones while slots last
                req = next(queue, None) if seats > 0 else None
                if req is None:
                    break
                seats -= 1
                left = req.num_tokens - req.num_computed_tokens - (cached(req) if cached is not None else 0)
                if left <= 1:  # a preempted request with its prompt cached: it decodes
                    decoding += 1
                    budget -= 1
                    continue
                a = state(req, left)
            take = min(a[1], budget)
            budget -= take
            total += take - 1
            a[1] -= take
            if a[1] > 0:
                still.append(a)
                continue
            decoding += 1  # the prompt is in: its first token is sampled at this step
            if a[2]:
                out.append(QueuedPrompt(a[0], step))
        still.extend(pending)
        if step == 0:
            first = total
        active = still
        if total <= 0 or len(out) >= limit:
            break
    return PrefillPlan(max(first, 0), tuple(out[:limit]))
