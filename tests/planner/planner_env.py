"""Helpers for the planner tests: a synthetic bandit environment (imported by the tests)."""

from __future__ import annotations

import random

from nightjar_worker.planner.policy import StepFeedback


def feedback(batch: int, gamma: int, loss: float, rng: random.Random, noise: float = 0.05,
             switch_cost_s: float = 0.0, fill: bool = False) -> StepFeedback:
    """A step whose per-token loss is ``loss`` (times noise): tokens = batch * (1 + gamma / 2).
    ``fill``: the first step with the draft back on, as in vLLM: same time, but nothing to verify
    yet (one token per request)."""
    tokens = max(1, int(batch * (1 + gamma / 2)))
    t = loss * tokens * (1.0 + noise * rng.gauss(0.0, 1.0))
    if fill:
        return StepFeedback(batch_size=batch, gamma=gamma, step_time_s=max(t, 1e-9), tokens_emitted=max(1, batch),
                            switch_cost_s=switch_cost_s)
    return StepFeedback(batch_size=batch, gamma=gamma, step_time_s=max(t, 1e-9), tokens_emitted=tokens,
                        num_draft_tokens=batch * gamma, num_accepted_tokens=batch * gamma // 2,
                        switch_cost_s=switch_cost_s)


def run_env(policy, losses: dict[int, dict[int, float]], batches: list[int], seed: int = 0,
            switch_cost_s: float = 0.0) -> list[int]:
    """Drive ``policy`` through ``batches``; ``losses[batch][gamma]`` is the true per-token loss.
    Resuming speculation (gamma 0 -> k) reports ``switch_cost_s`` and emits one token per request
    (pipeline fill, as in vLLM: drafts are verified in the step after the one that proposes them).
    Returns the chosen gammas."""
    rng = random.Random(seed)
    out, last = [], 0
    for b in batches:
        g = policy.decide(b)
        assert g in policy.arms
        sw = switch_cost_s if (g > 0 and last == 0 and out) else 0.0
        policy.observe(feedback(b, g, losses[b][g], rng, switch_cost_s=sw, fill=g > 0 and last == 0))
        out.append(g)
        last = g
    return out


def run_single_stream(policy, steps: int, seed: int = 0, acceptance: float = 0.7, request_tokens: int = 32,
                      prompt_tokens: int = 150) -> list[int]:
    """One request at a time (concurrency 1), shaped like the Qwen2.5-Coder 1.5B/0.5B pair in fp32
    on the CPU (step log of ``bench-serve --pair qwen``): a plain step takes 0.5 s, each draft token
    0.12 s, prompts prefill at 20 ms/token (the draft, when on, at 7 ms/token too), the first step
    with the draft back on verifies nothing, and C_switch = 0.1 s + 7.5 ms per token the draft
    missed (the running request's tokens only). Static gamma 2-3 give about 1.25x gamma 0's
    throughput. Returns the chosen gammas."""
    rng = random.Random(seed)
    out: list[int] = []
    last, missed, left = 0, 0, 0
    for _ in range(steps):
        new = left == 0
        g = policy.decide(0 if new else 1)
        noise = 1.0 + 0.04 * rng.gauss(0.0, 1.0)
        p = prompt_tokens if new else 0
        t = (0.5 + 0.12 * g + p * (0.02 + (0.007 if g else 0.0))) * noise
        tokens, drafted, accepted, sw = 1, 0, 0, 0.0
        if g > 0 and last == 0:
            sw = 0.1 + 0.0075 * missed  # catch-up; this step has nothing to verify (fill)
        elif g > 0 and not new:
            drafted = min(g, last)
            while accepted < drafted and rng.random() < acceptance:
                accepted += 1
            tokens += accepted
        missed = (0 if new else missed) + tokens + p if g == 0 else 0  # a finished request leaves
        left = request_tokens if new else max(0, left - tokens)
        policy.observe(StepFeedback(batch_size=0 if new else 1, gamma=g, step_time_s=t, tokens_emitted=tokens,
                                    num_draft_tokens=drafted, num_accepted_tokens=accepted, switch_cost_s=sw,
                                    prefill_tokens=p))
        out.append(g)
        last = g
    return out
