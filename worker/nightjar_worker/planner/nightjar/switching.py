"""The switching cost C_switch: what resuming speculation costs, learnt apart from the arms' losses.

Resuming (gamma 0 -> k) makes the engine rebuild the draft's KV cache (the catch-up, reported as
``StepFeedback.switch_cost_s``), and the first step back verifies nothing (pipeline fill). C_switch
is modelled as fixed + rate x tokens the draft missed while off (discounted least squares over
observed resumes), plus the bucket's fill excess, learnt per bucket because it grows with the
batch, not with the missed tokens (fitted together, the batch's growth showed up as a per-token
rate several times the real one, and turning the draft off was priced out). Until the line
stands (four resumes), the per-token rate is the draft's prefill rate where that is known (learnt
on prompt steps, or the priors'): a catch-up is the draft prefilling what it missed. Without it,
one small resume priced every later one at its own cost (Qwen pair at saturation, warm: a resume
after 8780 missed tokens predicted at 0.24 s, which took 44 s).

The paper instead folds C_switch into the loss of the switching step (``PaperSwitchCost``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nightjar_worker.planner.nightjar.excursions import MAX_DWELL
from nightjar_worker.planner.policy import StepFeedback

LAG_DECAY = 1.0 - 1.0 / 256  # share of the missed tokens still running after one more step


@dataclass(slots=True)
class CatchupFit:
    """Discounted least-squares sums of the catch-up's seconds (y) on the tokens it caught up (x)."""

    n: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def add(self, x: float, y: float, decay: float) -> None:
        self.n = decay * self.n + 1.0
        self.x = decay * self.x + x
        self.y = decay * self.y + y
        self.xx = decay * self.xx + x * x
        self.xy = decay * self.xy + x * y

    def line(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per token); None before the discounted weight of resumes that
        missed different amounts reaches 3 (four resumes: three weigh 2.85)."""
        n = self.n
        if n < 3:
            return None
        mx, my = self.x / n, self.y / n
        var = self.xx / n - mx * mx
        if var <= 1e-9 * max(mx * mx, 1.0):
            return None
        b = max((self.xy / n - mx * my) / var, 0.0)
        return max(my - b * mx, 0.0), b


class SwitchCost:
    """Learnt C_switch (``override`` replaces the prediction when the operator sets one)."""

    charged_to_step = False  # whether C_switch is added to the switching step's own loss

    __slots__ = ("catchup", "ema", "fill", "off_tokens", "override", "_prefill_rate")

    def __init__(self, buckets: int, override: float | None = None,
                 prefill_rate: Callable[[], float | None] = lambda: None) -> None:
        """``prefill_rate``: the draft's prefill seconds per token, or None while unknown."""
        self.catchup = CatchupFit()  # x = tokens the draft missed while off
        self.ema: float | None = None  # moving mean of observed C_switch (catch-up + fill)
        self.fill: list[float | None] = [None] * buckets  # pipeline-fill excess on resume, per bucket
        self.off_tokens = 0.0  # tokens emitted/prefilled since speculation went off
        self.override = override
        self._prefill_rate = prefill_rate

    def configure(self, *, override: float | None) -> None:
        """``override``: the operator's C_switch in seconds, replacing the prediction (None: learnt)."""
        self.override = override

    def observe(self, fb: StepFeedback, c: int, fill_excess: float | None) -> None:
        """One step in bucket c; ``fill_excess``: a resume's fill-step time above a plain step."""
        if fill_excess is not None:
            f0 = self.fill[c]
            self.fill[c] = fill_excess if f0 is None else 0.8 * f0 + 0.2 * fill_excess
        cost = fb.switch_cost_s + (fill_excess or 0.0)
        if cost > 0:
            e = self.ema
            self.ema = cost if e is None else 0.8 * e + 0.2 * cost
        if fb.switch_cost_s > 0:
            # over the engine's count of caught-up tokens when it gives one
            x = self.off_tokens if fb.catchup_tokens is None else float(fb.catchup_tokens)
            self.catchup.add(x, fb.switch_cost_s, 0.95)
        draft_off = fb.gamma == 0 or fb.source != "draft"  # an n-gram step does not run the draft either
        if draft_off and fb.draft_lag_tokens is not None:
            # the engine's count (running requests only), plus what this step adds
            self.off_tokens = fb.draft_lag_tokens + fb.tokens_emitted + fb.prefill_tokens
        elif draft_off:
            # a guess: requests that finish take their share away (~1/256 per step)
            self.off_tokens = self.off_tokens * LAG_DECAY + fb.tokens_emitted + fb.prefill_tokens
        else:
            self.off_tokens = 0.0

    def predict(self, missed_tokens: float, c: int) -> float:
        """Expected C_switch of resuming in bucket c after the draft missed ``missed_tokens``: the
        catch-up line plus the bucket's fill excess (each 0 while unknown: optimistic); before the
        line, the draft's prefill rate per missed token where known (the module's docstring)."""
        if self.override is not None:
            return self.override
        fill = self.fill[c] or 0.0
        line = self.catchup_line()
        if line is not None:
            return line[0] + line[1] * missed_tokens + fill
        n, sx, sy = self.catchup.n, self.catchup.x, self.catchup.y
        mx, my = (sx / n, sy / n) if n > 0 else (0.0, 0.0)
        rate = self._prefill_rate()
        if rate:  # the observed resumes' mean beyond that rate is the fixed part
            return max(my - rate * mx, 0.0) + rate * missed_tokens + fill
        if n <= 0:
            return fill
        # too few switches for a line: the more optimistic of "always the mean" and "proportional"
        return (min(my, my / mx * missed_tokens) if mx > 0 else my) + fill

    def now(self, c: int) -> float:
        """Expected C_switch of resuming in bucket c at this step."""
        return self.predict(self.off_tokens, c)

    def catchup_line(self) -> tuple[float, float] | None:
        """The catch-up's (fixed seconds, seconds per missed token); None before 4 resumes that
        missed different amounts."""
        return self.catchup.line()

    def catchup_rate(self) -> float | None:
        line = self.catchup_line()
        return line[1] if line is not None else None

    @staticmethod
    def lag_after(steps: int, per_step: float) -> float:
        """Tokens the draft will have missed after ``steps`` steps off: each step adds ``per_step``
        and requests that finish take theirs away, so the lag levels off at ~256 steps' worth."""
        return per_step * (1.0 - LAG_DECAY**steps) / (1.0 - LAG_DECAY)


class PaperSwitchCost(SwitchCost):
    """The paper's: C_switch is charged to the switching step's loss and predicted as its mean."""

    charged_to_step = True
    __slots__ = ()

    def predict(self, missed_tokens: float, c: int) -> float:
        if self.override is not None:
            return self.override
        return self.ema or 0.0


class Dwell:
    """Moving mean length of the policy's own runs with speculation off and on: how long a flip
    into that state is expected to last, the horizon over which its C_switch amortises."""

    __slots__ = ("off_mean", "on_mean", "run")

    def __init__(self, initial: float) -> None:
        self.off_mean = self.on_mean = initial
        self.run = 0  # steps since speculation last flipped on/off

    def mean(self, on: bool) -> float:
        """Mean length of the runs with speculation ``on`` (off when False)."""
        return self.on_mean if on else self.off_mean

    def step(self, flipped: bool, was_on: bool) -> None:
        if flipped:  # the run that just ended
            ended = min(self.run, MAX_DWELL)
            if was_on:
                self.on_mean += 0.2 * (ended - self.on_mean)
            else:
                self.off_mean += 0.2 * (ended - self.off_mean)
            self.run = 0
        self.run += 1


@dataclass(frozen=True, slots=True)
class Fill:
    """What a step is in the pipeline: a fill step (it raised gamma or changed source, so it
    verifies the previous step's drafts, not its own arm's) and whether it resumes the draft."""

    is_fill: bool = False
    resumes_draft: bool = False


class Pipeline:
    """Pipeline fill: drafts proposed in one step are verified in the next, so a step that raises
    gamma verifies only the previous step's drafts (none when the draft was off: one token per
    request, plus the drafting). It is not the arm's steady state and is not learnt as such; when
    resuming, its cost above a plain step belongs to the switch. (A change of source verifies the
    other source's drafts: not this arm's steady state either.)"""

    __slots__ = ("detect", "prev_source", "prev_gamma")

    def __init__(self, *, detect: bool) -> None:
        self.detect = detect  # the paper learns fill steps as the arm's own
        self.prev_source, self.prev_gamma = "draft", 0  # of the last observed step

    def step(self, fb: StepFeedback) -> Fill:
        src, prev_src, prev_gamma = fb.source, self.prev_source, self.prev_gamma
        self.prev_source, self.prev_gamma = src, fb.gamma
        fill = (fb.gamma > prev_gamma or (fb.gamma > 0 and src != prev_src)) and self.detect
        resumes = fill and src == "draft" and (prev_gamma == 0 or prev_src != "draft")
        return Fill(is_fill=fill, resumes_draft=resumes)
