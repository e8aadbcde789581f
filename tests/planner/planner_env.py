"""Helpers for the planner tests: a synthetic bandit environment (imported by the tests)."""

from __future__ import annotations

import random

from nightjar_worker.planner.policy import StepFeedback


def feedback(batch: int, gamma: int, loss: float, rng: random.Random, noise: float = 0.05,
             switch_cost_s: float = 0.0) -> StepFeedback:
    """A step whose per-token loss is ``loss`` (times noise): tokens = batch * (1 + gamma / 2)."""
    tokens = max(1, int(batch * (1 + gamma / 2)))
    t = loss * tokens * (1.0 + noise * rng.gauss(0.0, 1.0))
    return StepFeedback(batch_size=batch, gamma=gamma, step_time_s=max(t, 1e-9), tokens_emitted=tokens,
                        num_draft_tokens=batch * gamma, num_accepted_tokens=batch * gamma // 2,
                        switch_cost_s=switch_cost_s)


def run_env(policy, losses: dict[int, dict[int, float]], batches: list[int], seed: int = 0,
            switch_cost_s: float = 0.0) -> list[int]:
    """Drive ``policy`` through ``batches``; ``losses[batch][gamma]`` is the true per-token loss.
    Resuming speculation (gamma 0 -> k) reports ``switch_cost_s``. Returns the chosen gammas."""
    rng = random.Random(seed)
    out, last = [], 0
    for b in batches:
        g = policy.decide(b)
        assert g in policy.arms
        sw = switch_cost_s if (g > 0 and last == 0 and out) else 0.0
        policy.observe(feedback(b, g, losses[b][g], rng, switch_cost_s=sw))
        out.append(g)
        last = g
    return out
