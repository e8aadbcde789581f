"""The cost of prompt tokens prefilled in a decoding step, learnt so it can be taken out of the arms' losses.

The target's work on prompt tokens prefilled in the same step costs the same whatever gamma is, so
its learnt per-token cost is subtracted from every step's loss (otherwise arms that emit more
tokens look better merely by amortising someone else's prefill). The slope is a pooled within-cell
regression of step time on prompt tokens, kept separately with the draft off and on: a resident,
running draft prefills too.

The running draft's own prefill (on minus off) is the long-run price of keeping it on: every
gamma > 0 arm is charged its seconds per prompt token times the workload's prompt tokens per
generated token (``per_generated_token``), instead of leaving each prefill step's lump in
whichever arm that step's bin played. Until both states have seen prompts, the priors' slope
stands in, else the catch-up line's per-token rate (the same work: the draft prefilling what it
has not seen).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nightjar_worker.planner.nightjar.cells import Cell

_MIN_REGRESSION = 20  # samples before a draft-on/off specific slope is trusted
_MIN_PREFILL_STEPS = 3  # steps with prompt tokens, per draft state, before the draft's share is learnt
_RHO_DECAY = 1.0 - 1.0 / 2048  # prompt/generated token sums (the workload's mix: slow to change)


@dataclass(slots=True)
class SlopeFit:
    """The prefill regression of one draft state: decaying sums of x*y and x^2 (x: prompt tokens,
    y: step time, both about their cell's centre), the fitted slope and the sample counts."""

    sxy: float = 0.0
    sxx: float = 0.0
    beta: float = 0.0  # seconds per prompt token
    samples: int = 0
    prompted: int = 0  # samples whose step carried prompt tokens

    def add(self, x: float, y: float, prompted: bool) -> None:
        self.samples += 1
        self.prompted += prompted
        self.sxy = 0.9995 * self.sxy + x * y
        self.sxx = 0.9995 * self.sxx + x * x
        if self.sxx > 0:
            self.beta = max(0.0, self.sxy / self.sxx)


class PrefillCost:
    __slots__ = ("off", "on", "prompt_sum", "generated_sum", "prior_draft_slope", "amortise", "_catchup_rate")

    def __init__(self, amortise: bool, catchup_rate: Callable[[], float | None]) -> None:
        """``catchup_rate``: seconds per missed token of the draft's catch-up, or None while unknown."""
        self.off, self.on = SlopeFit(), SlopeFit()  # per draft state
        self.prompt_sum = 0.0  # decaying sums of prompt tokens and generated tokens, all steps
        self.generated_sum = 0.0
        self.prior_draft_slope: float | None = None  # the priors' draft prefill seconds per prompt token
        self.amortise = amortise
        self._catchup_rate = catchup_rate

    def configure(self, *, amortise: bool) -> None:
        """Whether the running draft's prefill is charged per generated token (see the module)."""
        self.amortise = amortise

    def set_prior_slope(self, draft_s_per_token: float | None) -> None:
        """The priors' draft prefill seconds per prompt token (per pair and device)."""
        self.prior_draft_slope = draft_s_per_token

    def observe_workload(self, prompt_tokens: int, generated_tokens: int) -> None:
        self.prompt_sum = self.prompt_sum * _RHO_DECAY + prompt_tokens
        self.generated_sum = self.generated_sum * _RHO_DECAY + generated_tokens

    def prompt_per_generated(self) -> float:
        """The workload's prompt tokens per generated token (0 before any)."""
        return self.prompt_sum / self.generated_sum if self.generated_sum > 0 else 0.0

    def regress(self, cell: Cell, p: int, t: float, draft_on: bool) -> None:
        """One step of ``cell`` with ``p`` prompt tokens took ``t`` s: a sample of the slope about
        the cell's moving centre (differences within a cell remove the arm's and batch's own cost)."""
        mp = cell.prompt_centre
        if mp is None:
            cell.prompt_centre = float(p)
            cell.time_centre = t
            return
        x, y = p - mp, t - cell.time_centre
        (self.on if draft_on else self.off).add(x, y, p > 0)
        cell.prompt_centre = mp + 0.05 * x
        cell.time_centre += 0.05 * y

    def slope(self, draft_on: bool) -> float:
        return self.slopes()[1 if draft_on else 0]

    def slopes(self) -> tuple[float, float]:
        """Prefill seconds per prompt token of a step with the draft off (the target's) and on
        (target and draft, once the draft's share is known; until then the target's, which leaves
        the running draft's prefill in the gamma > 0 arms' loss: a cost of keeping it on)."""
        extra = self.draft_slope()
        off = self._target_slope(extra)
        return off, (off + extra if extra is not None else off)

    def _target_slope(self, extra: float | None) -> float:
        """The target's seconds per prompt token: learnt with the draft off; else, with the draft's
        share known, learnt with it on less that share; else pooled over both states."""
        off, on = self.off, self.on
        if off.samples >= _MIN_REGRESSION and (extra is None or off.prompted >= _MIN_PREFILL_STEPS):
            return off.beta
        if extra is not None and on.samples >= _MIN_REGRESSION and on.prompted >= _MIN_PREFILL_STEPS:
            return max(0.0, on.beta - extra)
        sxx = off.sxx + on.sxx
        return max(0.0, (off.sxy + on.sxy) / sxx) if sxx > 0 else 0.0

    def learnt_draft_slope(self) -> float | None:
        """This worker's own draft-on minus draft-off slope; None until both rest on enough steps
        that carried prompts."""
        off, on = self.off, self.on
        if min(off.samples, on.samples) < _MIN_REGRESSION or min(off.prompted, on.prompted) < _MIN_PREFILL_STEPS:
            return None
        return max(0.0, on.beta - off.beta)
    def exported_draft_slope(self) -> float | None:
        """What a snapshot says of the draft's prefill: the worker's own slope once learnt, else the
        priors' (None: neither)."""
        own = self.learnt_draft_slope()
        return self.prior_draft_slope if own is None else own

    def draft_slope(self) -> float | None:
        """The running draft's extra seconds per prompt token (None unless amortising): the
        worker's own once learnt; until then the priors' (per pair and device), else the catch-up
        line's per-token rate (a worker whose first prompts all land in one draft state is not
        left without a price)."""
        if not self.amortise:
            return None
        own = self.learnt_draft_slope()
        if own is not None:
            return own
        if self.prior_draft_slope is not None:
            return self.prior_draft_slope
        return self._catchup_rate()

    def per_generated_token(self) -> float:
        """Seconds per generated token charged to gamma > 0 for the running draft's prefill (0
        until learnt)."""
        extra = self.draft_slope()
        if not extra or self.generated_sum <= 0:
            return 0.0
        return extra * self.prompt_sum / self.generated_sum
