"""Baseline (the limit): an oracle that knows the true cost surface and acceptance.

For every batch size it precomputes the expected loss of each gamma from the CostProfile
(step time over expected tokens, with the workload's category mix of acceptance rates) and
plays the best. Switching: resuming speculation costs C_switch (the profile's draft catch-up for the
tokens generated while off); the oracle turns speculation back on only when the expected gain
over ``switch_amortise_steps`` steps pays for it. Speculating also makes the draft prefill every
prompt: when the profile measured that and the workload's prompt/output ratio, each gamma > 0 pays
it per generated token.

With a ``SourceTable`` (``sim/sources.py``) the arms are every (source, gamma): per batch size it
plays the arm of least expected loss over all sources, each with its own acceptance mix and step
cost; only resuming the draft model pays C_switch (a host source has no cache to catch up), and
every step that does not run the draft adds to what it would catch up on. Like the single-source
oracle it is blind to switching beyond that guard: the best static arm in hindsight can beat it on
a trace where switching is dear.
"""

from __future__ import annotations

from nightjar_contract.planner import PlannerConfig

from nightjar_worker.planner.policy import StepFeedback
from nightjar_worker.sim.profile import CostProfile, expected_tokens
from nightjar_worker.sim.sources import DRAFT, SourceTable


class OraclePolicy:
    """Knows T(batch, gamma), the acceptance mix and C_switch; learns nothing."""

    name = "oracle"

    def __init__(
        self,
        config: PlannerConfig,
        profile: CostProfile,
        category_weights: dict[str, float] | None = None,
        context_tokens: int = 320,
        sources: SourceTable | None = None,
    ) -> None:
        self.context_tokens = context_tokens  # catch-up is bounded by the running contexts
        self._arms = config.resolved_arms()
        self.profile = profile
        self.horizon = config.switch_amortise_steps
        table = sources or SourceTable.draft_only()
        keys = [(DRAFT, g) for g in self._arms]
        keys += [(s, g) for s in table.names() if s != DRAFT for g in self._arms if g > 0]
        self.keys = keys
        self._runs_draft = [g > 0 and table[s].runs_draft for s, g in keys]
        weights = category_weights or {"all": 1.0}
        tot = sum(weights.values())
        # Expected tokens per request of each arm under the category mix (not E at the mean alpha).
        self._etok_key = [
            sum(w * expected_tokens(g, table[s].acceptance(profile, c)) for c, w in weights.items()) / tot
            for s, g in keys
        ]
        self._etok = {g: self._etok_key[i] for i, (s, g) in enumerate(keys) if s == DRAFT}
        self._loss: list[list[float]] = [[]]
        self._best: list[int] = [0]
        draft_prefill = profile.draft_prefill_per_output_token()
        for b in range(1, max(config.max_batch, profile.max_batch) + 1):
            losses = [table[s].step_time(profile, b, g) / (b * self._etok_key[i])
                      + (draft_prefill if self._runs_draft[i] else 0.0) for i, (s, g) in enumerate(keys)]
            self._loss.append(losses)
            self._best.append(min(range(len(keys)), key=losses.__getitem__))
        self._plain = keys.index((DRAFT, 0)) if (DRAFT, 0) in keys else None
        self._drafting = False
        self._source = DRAFT
        self._off_tokens = 0.0

    @property
    def arms(self) -> tuple[int, ...]:
        return self._arms

    def expected_loss(self, batch_size: int, gamma: int, source: str = DRAFT) -> float:
        b = min(max(batch_size, 1), len(self._loss) - 1)
        return self._loss[b][self.keys.index((DRAFT, 0) if gamma == 0 else (source, gamma))]

    def source(self) -> str:
        """The source of the last decision's drafts (``SourcePolicy``)."""
        return self._source

    def decide(self, batch_size: int, prompt_tokens: int = 0) -> int:
        b = min(max(batch_size, 1), len(self._loss) - 1)
        losses = self._loss[b]
        i = self._best[b]
        if self._runs_draft[i] and not self._drafting:
            # resuming the draft: worth it only if the gain over the horizon pays C_switch; else the
            # best arm that leaves the draft off
            off = [j for j in range(len(self.keys)) if not self._runs_draft[j]]
            j = min(off, key=losses.__getitem__) if off else i
            gain = (losses[j] - losses[i]) * self.horizon * b * self._etok_key[i]
            if off and gain < self.profile.switch_cost(min(self._off_tokens, b * self.context_tokens)):
                i = j
        self._drafting = self._runs_draft[i]
        s, g = self.keys[i]
        self._source = s if g > 0 else DRAFT
        return g

    def observe(self, feedback: StepFeedback) -> None:
        if feedback.gamma == 0 or feedback.source != DRAFT:
            self._off_tokens += feedback.tokens_emitted
        else:
            self._off_tokens = 0.0
