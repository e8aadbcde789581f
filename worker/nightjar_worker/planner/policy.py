"""The contract between the engine and every gamma policy (Nightjar's planner and the baselines).

Step contract (one decoding step of the continuous batch):
  1. before scheduling, the engine calls ``decide(batch_size, prompt_tokens)`` and gets gamma in
     ``arms``; gamma == 0 means a plain autoregressive step (no draft forward at all);
     ``prompt_tokens`` is the engine's estimate of the prompt tokens the step will prefill (which a
     running draft prefills too), 0 when unknown; policies may ignore it;
  2. the engine runs the step: it verifies at most gamma of the drafts the *previous* step proposed
     and proposes gamma for the next one, so a step that raises gamma verifies fewer (none when
     the draft was off: one token per request) - pipeline fill, not the arm's steady state;
  3. after the step, the engine calls ``observe(StepFeedback(...))`` with what it measured.
     ``switch_cost_s`` is non-zero on the first step after speculation resumes from gamma == 0:
     the measured time to rebuild (catch up) the draft's KV cache, i.e. C_switch.

Policies are pure Python (no torch, no vllm) and deterministic under their seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from nightjar_contract.planner import PlannerPriors


@dataclass(frozen=True, slots=True)
class StepFeedback:
    """One decoding step as the engine measured it: the one record, built once by the scheduler
    and read by the policy, the step listeners (memory manager, benchmarks), the metrics and the
    step log (``engine/step_stats.py``).

    ``step_time_s`` runs from the start of ``Scheduler.schedule()`` to the start of
    ``update_from_output()`` for the same step, the draft's catch-up (``switch_cost_s``, measured in
    the worker) excluded."""

    batch_size: int
    gamma: int
    step_time_s: float
    tokens_emitted: int  # tokens generated for the whole batch this step (accepted + bonus)
    num_draft_tokens: int = 0  # drafts verified this step (0 for gamma == 0)
    num_accepted_tokens: int = 0
    switch_cost_s: float = 0.0  # draft KV catch-up time charged to this step (C_switch)
    # prompt tokens prefilled in the same step (chunked prefill merged into the batch); lets a
    # policy separate the gamma-independent prefill work from the decoding cost. 0 if unknown.
    prefill_tokens: int = 0
    # gamma == 0 steps: positions of the running requests the draft's KV cache lacks before this
    # step (what resuming would catch up on, plus this step's tokens); None if the engine cannot tell
    draft_lag_tokens: int | None = None
    # resume steps: tokens the draft re-processed in its catch-up (what switch_cost_s paid for);
    # None if the engine cannot tell (the policy then uses its own count of what was missed)
    catchup_tokens: int | None = None
    # engine bookkeeping (step log, metrics, benchmarks; the policies ignore it)
    step: int = 0
    num_reqs: int = 0  # requests scheduled (batch_size is the context gamma was decided at)
    draft_forwards: int = 0  # draft model forward calls in the worker (0 at gamma == 0)
    decide_prompt_tokens: int = 0  # the estimate of prefill_tokens the policy decided with
    decide_s: float = 0.0  # policy.decide wall time
    time: float = 0.0  # unix time at the end of the step
    # where this step's gamma drafts come from (``SOURCES``); gamma 0 steps say "draft"
    source: str = "draft"
    # where the drafts verified in this step came from: the previous step proposed them, so at a
    # change of source they are the other source's (None: ``source``, as in the simulator)
    drafts_source: str | None = None

    @property
    def verified_source(self) -> str:
        """The source whose drafts ``num_draft_tokens`` / ``num_accepted_tokens`` count."""
        return self.drafts_source or self.source

    @property
    def loss(self) -> float:
        """Latency per generated token (seconds/token), the planner's loss, C_switch included."""
        return (self.step_time_s + self.switch_cost_s) / max(1, self.tokens_emitted)


# Where drafts come from: the draft model, prompt lookup (n-gram matches in the request's own
# tokens) or suffix trees (engine/suffix.py: the request's and earlier outputs); the last two need no
# weights and no KV cache, so they run while the draft is offloaded.
SOURCES = ("draft", "ngram", "suffix")


@runtime_checkable
class SourcePolicy(Protocol):
    """A policy that also picks the source of a gamma > 0 step's drafts. ``source()`` is that of
    its last ``decide``; a policy without it always drafts with the draft model."""

    def source(self) -> str: ...


@runtime_checkable
class DraftAware(Protocol):
    """A policy told whether the draft model can run (its weights resident), so that while it
    cannot, it picks among the arms that do not need it instead of having its choice clamped;
    ``draft_demand`` then says which draft gamma it would play at a batch (0: none), what the
    memory manager weighs bringing the draft back against."""

    def set_draft_available(self, available: bool) -> None: ...

    def draft_demand(self, batch_size: int) -> int: ...


@dataclass(frozen=True, slots=True)
class QueuedPrompt:
    """A request whose first token has not been sampled yet, as the engine sees it before a step:
    how long it has waited since it arrived, and how many prompt steps come before the one that
    prefills the end of its prompt (0: this step), walking the queue the way the scheduler admits
    (``engine/step_prompt.py``). Requests that wait for a batch slot or KV blocks to free up are
    left out: when they start depends on other requests finishing, not on the prompt steps."""

    wait_s: float
    steps_ahead: int


@runtime_checkable
class QueueAware(Protocol):
    """A policy told, before each ``decide``, the prompts still waiting for their first token (in
    admission order), so that an SLO objective can price a step by the first tokens it delays;
    ``wants_queue`` says whether it prices them now (the engine then walks the queue beyond the
    next step: otherwise only that step's prompts are listed)."""

    def wants_queue(self) -> bool: ...

    def observe_queue(self, queue: tuple[QueuedPrompt, ...]) -> None: ...


@runtime_checkable
class GammaPolicy(Protocol):
    """Picks the speculation length for each step. See the module docstring for the contract."""

    name: str

    @property
    def arms(self) -> tuple[int, ...]: ...

    def decide(self, batch_size: int, prompt_tokens: int = 0) -> int: ...

    def observe(self, feedback: StepFeedback) -> None: ...


@dataclass
class PlannerStats:
    """A learning policy's counters, for metrics."""

    decisions: int = 0
    bins: int = 0
    explore_bins: int = 0
    switches_on: int = 0
    switches_off: int = 0
    switch_cost_s_ema: float = 0.0
    priors_dropped: int = 0  # prior entries dropped for contradicting the arm's own evidence
    prior_rescales: int = 0  # buckets' priors rescaled to the level of this worker's evidence
    ttft_deferrals: int = 0  # steps played at gamma 0 for the TTFT target (prompt steps, resumes: SLO objective)


@runtime_checkable
class PlannerView(Protocol):
    """What the rest of the worker reads from a learning policy (read-only; Nightjar's planner).

    The memory manager weighs a draft reload against ``speculation_gain_s`` and ``switch_cost_s``;
    the metrics export the gate, the draft's prefill charge, the counters and the snapshot (which
    the operator's fleet loop averages into priors). Baselines do not implement it."""

    stats: PlannerStats

    def speculation_gain_s(self, batch_size: int) -> float | None:
        """Seconds a step at this batch saves by speculating (negative: it loses); None if unknown."""
        ...

    def switch_cost_s(self, batch_size: int) -> float:
        """Expected C_switch of resuming speculation now at this batch (seconds)."""
        ...

    def acceptance_gate_closed(self) -> bool: ...

    def draft_prefill_per_token(self) -> float: ...

    def snapshot(self) -> PlannerPriors: ...
