"""The switching cost C_switch: what resuming speculation costs, learnt apart from the arms' losses.

Resuming (gamma 0 -> k) makes the engine rebuild the draft's KV cache (the catch-up, reported as
``StepFeedback.switch_cost_s``), and the first step back verifies nothing (pipeline fill). C_switch
is modelled as fixed + rate x tokens the draft missed while off (discounted least squares over
observed resumes), plus the bucket's fill excess, learnt per bucket because it grows with the
batch, not with the missed tokens (fitted together, the batch's growth showed up as a per-token
rate several times the real one, and turning the draft off was priced out).

The paper instead folds C_switch into the loss of the switching step (``PaperSwitchCost``).
"""

from __future__ import annotations

from nightjar_worker.planner.nightjar.excursions import MAX_DWELL
from nightjar_worker.planner.policy import StepFeedback

LAG_DECAY = 1.0 - 1.0 / 256  # share of the missed tokens still running after one more step


class SwitchCost:
    """Learnt C_switch (``override`` replaces the prediction when the operator sets one)."""

    charged_to_step = False  # whether C_switch is added to the switching step's own loss

    __slots__ = ("sw", "ema", "fill", "off_tokens", "override")

    def __init__(self, buckets: int, override: float | None = None) -> None:
        self.sw = [0.0] * 5  # catch-up regression sums: n, x, y, xx, xy (x = missed tokens)
        self.ema: float | None = None  # moving mean of observed C_switch (catch-up + fill)
        self.fill: list[float | None] = [None] * buckets  # pipeline-fill excess on resume, per bucket
        self.off_tokens = 0.0  # tokens emitted/prefilled since speculation went off
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
            y, f = fb.switch_cost_s, 0.95
            sw = self.sw
            sw[0] = f * sw[0] + 1.0
            sw[1] = f * sw[1] + x
            sw[2] = f * sw[2] + y
            sw[3] = f * sw[3] + x * x
            sw[4] = f * sw[4] + x * y
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
        catch-up line plus the bucket's fill excess (each 0 while unknown: optimistic)."""
        if self.override is not None:
            return self.override
        fill = self.fill[c] or 0.0
        n, sx, sy = self.sw[:3]
        if n <= 0:
            return fill
        line = self.catchup_line()
        if line is not None:
            return line[0] + line[1] * missed_tokens + fill
        # too few switches for a line: the more optimistic of "always the mean" and "proportional"
        mx, my = sx / n, sy / n
        return (min(my, my / mx * missed_tokens) if mx > 0 else my) + fill

    def now(self, c: int) -> float:
        """Expected C_switch of resuming in bucket c at this step."""
        return self.predict(self.off_tokens, c)

    def catchup_line(self) -> tuple[float, float] | None:
        """The catch-up's (fixed seconds, seconds per missed token); None before 3 resumes that
        missed different amounts."""
        n, sx, sy, sxx, sxy = self.sw
        if n < 3:
            return None
        mx, my = sx / n, sy / n
        var = sxx / n - mx * mx
        if var <= 1e-9 * max(mx * mx, 1.0):
            return None
        b = max((sxy / n - mx * my) / var, 0.0)
        return max(my - b * mx, 0.0), b

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
    """Moving mean length of the policy's own runs with speculation off [0] and on [1]: how long a
    flip into that state is expected to last, the horizon over which its C_switch amortises."""

    __slots__ = ("mean", "run")

    def __init__(self, initial: float) -> None:
        self.mean = [initial, initial]
        self.run = 0  # steps since speculation last flipped on/off

    def step(self, flipped: bool, was_on: bool) -> None:
        if flipped:
            k = 1 if was_on else 0  # the run that just ended
            self.mean[k] += 0.2 * (min(self.run, MAX_DWELL) - self.mean[k])
            self.run = 0
        self.run += 1
