"""The context's own excursions per bucket: how long the batch stays at or above / at or below it.

The draft, once off, stays off until the context falls to a bucket where resuming pays: a
turn-off's run is an excursion above that bucket, and a resume there amortises over the stay below
the buckets where speculation gains.
The policy's own on/off runs only say what its current choices produce (short off-runs under a
mostly-on policy), so turn-offs are priced on these instead.
"""

from __future__ import annotations

MAX_DWELL = 1024  # cap on the amortisation horizon of a flip (steps)
_RATE = 0.1  # moving-mean rate of the excursion lengths


class Excursions:
    __slots__ = ("ctx", "steps", "start", "exc")

    def __init__(self, buckets: int, initial: float) -> None:
        self.ctx = -1  # bucket of the last observed step
        self.steps = 0  # observed steps
        self.start = [[0] * buckets, [0] * buckets]  # [at or above, at or below] run starts
        self.exc = [[initial] * buckets for _ in range(2)]  # their moving mean lengths

    def above(self, c: int) -> float:
        """Mean length of the context's runs at or above bucket c."""
        return self.exc[0][c]

    def below(self, c: int) -> float:
        """Mean length of the context's runs at or below bucket c."""
        return self.exc[1][c]

    def staying_below(self, c: int) -> float:
        """How long the context stays at or below bucket c: the mean of its past runs there, or the
        current run's length so far when it is in one and that is longer (a run not yet ended is
        in no mean: a load that has held the batch there all along would otherwise look brief)."""
        now = self.steps - self.start[1][c] if 0 <= self.ctx <= c else 0
        return max(self.exc[1][c], float(min(now, MAX_DWELL)))

    def step(self, c: int) -> None:
        """One observed step in bucket c."""
        self.steps += 1
        if c != self.ctx:
            self._cross(c)

    def _cross(self, c: int) -> None:
        """The context moved from bucket self.ctx to c: close the excursions it left (at or above
        the buckets it fell below, at or below those it rose above) and open the ones it entered."""
        prev, now, start, exc = self.ctx, self.steps, self.start, self.exc
        self.ctx = c
        if prev < 0:
            for k in range(len(start[0])):
                start[0][k] = start[1][k] = now
            return
        lo, hi = (prev, c) if c > prev else (c, prev)
        up = c > prev
        for k in range(lo + 1, hi + 1):  # thresholds crossed for "at or above k"
            if up:
                start[0][k] = now
            else:
                exc[0][k] += _RATE * (min(now - start[0][k], MAX_DWELL) - exc[0][k])
        for k in range(lo, hi):  # and for "at or below k"
            if up:
                exc[1][k] += _RATE * (min(now - start[1][k], MAX_DWELL) - exc[1][k])
            else:
                start[1][k] = now
