"""Baseline (the limit): an oracle that knows the true cost surface and acceptance.

For every batch size it precomputes the expected loss of each gamma from the CostProfile
(step time over expected tokens, with the workload's category mix of acceptance rates) and
plays the best. Switching: resuming speculation costs C_switch (the profile's draft catch-up for the
tokens generated while off); the oracle turns speculation back on only when the expected gain
over ``switch_amortise_steps`` steps pays for it. Speculating also makes the draft prefill every
prompt: when the profile measured that and the workload's prompt/output ratio, each gamma > 0 pays
it per generated token.
"""

from __future__ import annotations

from nightjar_contract.planner import PlannerConfig

from nightjar_worker.planner.policy import StepFeedback
from nightjar_worker.sim.profile import CostProfile, expected_tokens


class OraclePolicy:
    """Knows T(batch, gamma), the acceptance mix and C_switch; learns nothing."""

    name = "oracle"

    def __init__(
        self,
        config: PlannerConfig,
        profile: CostProfile,
        category_weights: dict[str, float] | None = None,
        context_tokens: int = 320,
    ) -> None:
        self.context_tokens = context_tokens  # catch-up is bounded by the running contexts
        self._arms = config.resolved_arms()
        self.profile = profile
        self.horizon = config.switch_amortise_steps
        weights = category_weights or {"all": 1.0}
        tot = sum(weights.values())
        # Expected tokens per request of each arm under the category mix (not E at the mean alpha).
        self._etok = {
            g: sum(w * expected_tokens(g, profile.alpha(c)) for c, w in weights.items()) / tot
            for g in self._arms
        }
        self._loss: list[dict[int, float]] = [{}]
        self._best: list[int] = [0]
        draft_prefill = profile.draft_prefill_per_output_token()
        for b in range(1, max(config.max_batch, profile.max_batch) + 1):
            losses = {g: profile.step_time(b, g) / (b * self._etok[g]) + (draft_prefill if g > 0 else 0.0)
                      for g in self._arms}
            self._loss.append(losses)
            self._best.append(min(self._arms, key=losses.__getitem__))
        self._last = 0
        self._off_tokens = 0.0

    @property
    def arms(self) -> tuple[int, ...]:
        return self._arms

    def expected_loss(self, batch_size: int, gamma: int) -> float:
        b = min(max(batch_size, 1), len(self._loss) - 1)
        return self._loss[b][gamma]

    def decide(self, batch_size: int, prompt_tokens: int = 0) -> int:
        b = min(max(batch_size, 1), len(self._loss) - 1)
        g = self._best[b]
        if g > 0 and self._last == 0 and 0 in self._loss[b]:
            losses = self._loss[b]
            gain = (losses[0] - losses[g]) * self.horizon * b * self._etok[g]
            if gain < self.profile.switch_cost(min(self._off_tokens, b * self.context_tokens)):
                g = 0
        self._last = g
        return g

    def observe(self, feedback: StepFeedback) -> None:
        if feedback.gamma == 0:
            self._off_tokens += feedback.tokens_emitted
        else:
            self._off_tokens = 0.0
