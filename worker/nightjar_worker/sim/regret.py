"""Regret measurement: a contextual-bandit environment with exogenous contexts.

The batch size sequence is exogenous (a slowly mean-reverting random walk in log batch size over
1..max_batch, fixed by the seed), so the policy under test and the oracle face exactly the same
contexts and the same noise draws (common random numbers). Per step, with z1, z2 standard normal:

    step_time = T(B, gamma) * (1 + noise_cv * z1)
    tokens    = max(B, round(B * E[gamma] + z2 * sqrt(B * Var[gamma])))   (geometric acceptance,
                mean and variance over the workload's category mix)
    loss      = step_time + C_switch - tokens * c*(B)      (seconds)

with c*(B) = min_gamma T(B, gamma) / (B * E[gamma]) the best expected time per token at that batch: a
step's loss is the time it took beyond what the best arm needs for the tokens it emitted. This is the
planner's objective (total time over total tokens per context, the latency per token requests see)
made additive; a per-step ratio (step_time / tokens) would score another objective, since
E[1/tokens] > 1/E[tokens] penalises the variance of the deeper arms at small batches.
C_switch (when gamma goes 0 -> k) = profile.switch_cost(tokens emitted while speculation was off,
capped at B * ``context_tokens``: the draft never has to catch up on more than the running contexts).
Regret after n steps: R(n) = sum_{t<=n} loss_policy(t) - sum_{t<=n} loss_oracle(t) (the oracle's
losses are zero-mean noise plus its switching costs, drawn with the same random numbers).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

from nightjar_worker.planner.policy import GammaPolicy, SourcePolicy, StepFeedback
from nightjar_worker.sim.profile import CostProfile
from nightjar_worker.sim.sources import DRAFT, Source, SourceTable


def token_moments(gamma: int, weights: dict[str, float], profile: CostProfile,
                  source: Source | None = None) -> tuple[float, float]:
    """Mean and variance of tokens emitted per request (accepted + 1) under the category mix
    (acceptance of ``source``; default the profile's draft)."""
    tot = sum(weights.values())
    m1 = m2 = 0.0
    for cat, w in weights.items():
        a = profile.alpha(cat) if source is None else source.acceptance(profile, cat)
        for k in range(gamma + 1):
            p = a**k * (1 - a) if k < gamma else a**gamma
            m1 += w / tot * p * (k + 1)
            m2 += w / tot * p * (k + 1) ** 2
    return m1, max(m2 - m1 * m1, 0.0)


def batch_contexts(n: int, seed: int, max_batch: int, mean_batch: float = 24.0) -> list[int]:
    rng = random.Random(seed)
    x = math.log(mean_batch)
    mu, hi = math.log(mean_batch), math.log(max_batch)
    out = []
    for _ in range(n):
        x += 0.01 * (mu - x) + 0.14 * rng.gauss(0.0, 1.0)
        x = min(max(x, 0.0), hi)
        out.append(max(1, min(max_batch, round(math.exp(x)))))
    return out


@dataclass
class RegretRun:
    """One policy's pass over the contexts."""

    losses_s: list[float] = field(default_factory=list)  # per step, see the module docstring
    time_s: float = 0.0  # step and switch time in all
    decide_s: list[float] = field(default_factory=list)  # decide() durations (time_decisions only)


class RegretEnv:
    def __init__(
        self,
        profile: CostProfile,
        weights: dict[str, float],
        arms: tuple[int, ...],
        contexts: list[int],
        seed: int = 0,
        noise_cv: float = 0.03,
        context_tokens: int = 320,
        sources: SourceTable | None = None,
    ) -> None:
        self.profile = profile
        self.context_tokens = context_tokens
        self.contexts = contexts
        self.seed = seed
        self.noise_cv = noise_cv
        # arms are (source, gamma): the draft's gammas, and every other source's gammas > 0
        self.sources = sources or SourceTable.draft_only()
        keys = [(DRAFT, g) for g in arms] + [(s, g) for s in self.sources.names() if s != DRAFT for g in arms if g > 0]
        self.moments = {k: token_moments(k[1], weights, profile, self.sources[k[0]]) for k in keys}
        self._t: dict[tuple[str, int, int], float] = {}
        self._best: dict[int, float] = {}

    def _step_time(self, b: int, g: int, src: str = DRAFT) -> float:
        v = self._t.get((src, b, g))
        if v is None:
            v = self._t[(src, b, g)] = self.sources[src].step_time(self.profile, b, g)
        return v

    def best_cost_per_token(self, b: int) -> float:
        """c*(b): the best arm's expected step time per expected token at batch ``b``."""
        v = self._best.get(b)
        if v is None:
            v = self._best[b] = min(self._step_time(b, g, s) / (b * m) for (s, g), (m, _) in self.moments.items())
        return v

    def run(self, policy: GammaPolicy, time_decisions: bool = False) -> RegretRun:
        """``policy`` over the contexts: per-step losses, total time (and decide() durations)."""
        rng = random.Random(self.seed)
        prof = self.profile
        cv = self.noise_cv
        out = RegretRun()
        losses = out.losses_s
        last, lag = False, 0.0  # last: whether the previous step ran the draft
        clock = time.perf_counter
        picks = isinstance(policy, SourcePolicy)
        for b in self.contexts:
            z1, z2 = rng.gauss(0.0, 1.0), rng.gauss(0.0, 1.0)
            if time_decisions:
                t0 = clock()
                g = policy.decide(b)
                out.decide_s.append(clock() - t0)
            else:
                g = policy.decide(b)
            src = policy.source() if picks and g > 0 else DRAFT
            drafting = g > 0 and self.sources[src].runs_draft
            m, v = self.moments[(src if g > 0 else DRAFT, g)]
            st = self._step_time(b, g, src) * min(max(1.0 + cv * z1, 0.5), 1.5)
            tokens = max(b, round(b * m + z2 * math.sqrt(b * v)))
            sw, caught = 0.0, None
            # what the draft lacks of the running contexts (the engine reports it at gamma 0)
            lacks = min(lag, b * self.context_tokens)
            if drafting and not last and losses:
                caught = lacks
                sw = prof.switch_cost(caught)
            lag = lag + tokens if not drafting else 0.0
            losses.append(st + sw - tokens * self.best_cost_per_token(b))
            out.time_s += st + sw
            policy.observe(
                StepFeedback(
                    batch_size=b, gamma=g, step_time_s=st, tokens_emitted=tokens,
                    num_draft_tokens=b * g, num_accepted_tokens=tokens - b, switch_cost_s=sw,
                    catchup_tokens=None if caught is None else round(caught),
                    draft_lag_tokens=round(lacks) if not drafting else None, source=src,
                )
            )
            last = drafting
        return out


def cumulative_regret(policy_losses: list[float], oracle_losses: list[float]) -> list[float]:
    out, acc = [], 0.0
    for a, b in zip(policy_losses, oracle_losses, strict=True):
        acc += a - b
        out.append(acc)
    return out


def loglog_slope(regret: list[float], start_frac: float = 0.05, points: int = 24) -> float:
    """Least-squares slope of log R(n) against log n over log-spaced n in [start_frac*N, N]."""
    n_tot = len(regret)
    lo = max(10, int(n_tot * start_frac))
    xs, ys = [], []
    for k in range(points):
        n = int(round(math.exp(math.log(lo) + (math.log(n_tot) - math.log(lo)) * k / (points - 1))))
        r = regret[min(n, n_tot) - 1]
        if r > 0:
            xs.append(math.log(n))
            ys.append(math.log(r))
    if len(xs) < 3:
        return 0.0  # regret not positive: no growth to fit
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
