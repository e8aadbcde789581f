"""Pricing a flip of speculation on/off: C_switch amortised per token over how long the new state lasts.

Turning on pays the predicted catch-up now; turning off is charged the C_switch of coming back
later. The horizon is, for exploitation, the expected length of a run in the state entered: for a
turn-on the policy's own on-runs (``Dwell``) or, when longer, how long the context stays at or below
the buckets where speculation gains (``on_run``); for a turn-off how long the context stays above
the batch where resuming pays (``Excursions``). The policy's own runs only say what its choices
produced: short off-runs under a mostly-on policy priced a profitable turn-off out, and short
on-runs (explorations, a wave's edges) priced a resume out for good once the draft had missed the
whole running context (long prompts at steady high load on the roofline: a catch-up of ~270 ms
against 23-step on-runs kept the draft off for 60 % of the steps, goodput 0.43-0.53 of the best
static arm's on some traces). An exploration visit amortises over the visit (paying a large
C_switch for a two-step look is a loss).
"""

from __future__ import annotations

from nightjar_worker.planner.nightjar.estimates import Estimator
from nightjar_worker.planner.nightjar.excursions import MAX_DWELL, Excursions
from nightjar_worker.planner.nightjar.switching import Dwell, SwitchCost


class FlipPricer:
    def __init__(self, est: Estimator, switch: SwitchCost, dwell: Dwell, excursions: Excursions,
                 amortise_steps: int) -> None:
        self.est, self.switch, self.dwell, self.excursions = est, switch, dwell, excursions
        self.amortise_steps = amortise_steps
        self.i0 = est.arms.of("draft", 0)
        # per bucket, the best arm without the draft model (gamma 0, n-gram) less the best arm with
        # it, at the bucket's last bin (bucket units): what running the draft gains there
        self.on_gain: list[float | None] = [None] * len(est)

    def configure(self, *, amortise_steps: int) -> None:
        """Steps a flip's C_switch amortises over at least (``switch_amortise_steps``)."""
        self.amortise_steps = amortise_steps

    def gain(self, c: int) -> float | None:
        """What running the draft gains in bucket c at its last bin (bucket units); None unknown."""
        return self.on_gain[c]

    def note_gain(self, c: int, means: list[float | None]) -> None:
        """Record bucket c's gain of the draft model from its arms' means at a new bin."""
        drafting = self.est.arms.drafting
        on = [m for i, m in enumerate(means) if m is not None and drafting[i]]
        if self.i0 is None:
            self.on_gain[c] = None
            return
        off = [m for i, m in enumerate(means) if m is not None and not drafting[i] and i != self.i0]
        m0 = means[self.i0]
        base = m0 if not off or m0 is None else min([m0, *off])
        self.on_gain[c] = base - min(on) if on and base is not None else None

    def visit(self, hold: int) -> int:
        """Steps over which an exploration visit amortises C_switch: its hold, but at least a quarter
        of the exploitation dwell (a visit that finds a better arm is followed by exploiting it)."""
        return max(hold, self.amortise_steps // 4, 1)

    def penalty(self, c: int, i: int, on_now: bool, horizon: int | None = None, off_steps: int | None = None) -> float:
        """C_switch amortised per token (bucket c's units) if playing arm i flips speculation from
        ``on_now``; 0 if it does not. ``horizon``: amortise over this many steps instead of the
        expected run; ``off_steps``: how long a turn-off lasts (default: the horizon)."""
        on = self.est.arms.drafting[i]
        if on == on_now:
            return 0.0
        per_step = self.est.tokens_per_step(c, i)
        if horizon is None:
            # not the current run's length: a long pause says nothing about how long the next
            # run lasts (amortising a resume over it made resumes look cheap after long pauses)
            run = max(self.dwell.on_mean, self.on_run(c)) if on else max(self.dwell.off_mean, self.off_run(c, per_step))
            h = int(max(self.amortise_steps, run))
        else:
            h = max(horizon, 1)
        sw = self.switch
        if on:
            cost = sw.predict(sw.off_tokens, c)  # catch up on what was missed so far
        else:  # coming back after the steps off
            cost = sw.predict(sw.lag_after(h if off_steps is None else max(off_steps, 1), per_step), c)
            if sw.ema is not None and sw.override is None:
                # the lag extrapolated at this batch overshoots: speculation resumes at a smaller
                # batch, whose running contexts bound the catch-up; observed resumes embody that
                cost = min(cost, sw.ema)
        if not cost:
            return 0.0
        pen = cost / (h * per_step)
        return self.est.in_bucket_units(c, pen)

    def on_run(self, c: int) -> float:
        """Expected steps the draft stays on if it resumes in bucket c: the context's stay at or
        below the highest bucket up to which, from c on, speculation gains (``gain`` > 0)."""
        top = c
        while top + 1 < len(self.on_gain) and (g := self.on_gain[top + 1]) is not None and g > 0:
            top += 1
        return self.excursions.staying_below(top)

    def off_run(self, c: int, per_step: float) -> float:
        """Expected steps the draft stays off if it turns off in bucket c: until the context falls
        to a bucket where resuming pays (its best drafting arm beats gamma 0 by more than a resume
        amortised over the context's stay at or below it), i.e. the context's excursion above the
        highest such bucket below c; no such bucket: off for good. That resume lies ahead, so its
        stay is the mean of ended stays (``below``), not ``staying_below``'s current one, which
        ``on_run`` counts for a resume now."""
        sw, i0 = self.switch, self.i0
        if i0 is None:  # no gamma-0 arm: no gain is ever known
            return float(MAX_DWELL)
        cost = sw.ema
        if cost is None:
            cost = sw.predict(sw.lag_after(int(self.dwell.off_mean), per_step), c)
        for r in range(c - 1, -1, -1):
            gain = self.on_gain[r]
            if gain is None or gain <= 0:
                continue
            tok = self.est.tokens_per_step(r, i0)
            pen = self.est.in_bucket_units(r, cost / (max(self.excursions.below(r), 1.0) * tok))
            if gain > pen:
                return self.excursions.above(r + 1)
        return float(MAX_DWELL)
