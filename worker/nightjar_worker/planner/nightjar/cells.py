"""Per (bucket, arm) statistics: discounted sufficient statistics in one slotted record per cell.

Discounting is O(1): every weighted field is stored scaled by its bucket's weight ``w`` (an
observation enters with weight w, then w /= discount), so reading a field means dividing by w.
``Cell.WEIGHTED`` names those fields once: ``Bucket.rescale`` and ``Bucket.discount`` act on
exactly them, and a test checks that every float slot is either weighted or listed as not.
"""

from __future__ import annotations

import math

DEFAULT_CV = 0.3  # relative noise assumed before a bucket has its own estimate
_RESCALE_AT = 1e150


def less_prefill(loss_sum: float, prompt_tokens: float, slope: float) -> float:
    """A loss sum less its prompt tokens' learnt prefill cost, floored at 5 % so a slope fitted
    too steep never makes an arm look free."""
    return max(loss_sum - slope * prompt_tokens, 0.05 * loss_sum)


class Cell:
    """One arm in one bucket. Weighted sums (scaled by the bucket's ``w``):

    n: effective observations; s: loss sum (mean = s / n); sp: prompt tokens per generated token x
    count (the prefill the loss sum carries); st, spt: sums of step time and prompt tokens whose
    ratios to ``tok`` give s / n and sp / n; sa, saa, sab, sbb: sums of a, a^2, a*b, b^2 (a = a
    step's loss x tokens, b = its tokens) for the noise of the ratio-of-sums mean; tok: tokens;
    tpot: per-request time per token; pn, ps: the prior's count and loss sum (same scaling).
    Not weighted: raw (undiscounted observations), mp, mt (moving means of the cell's prompt
    tokens and step time, the centre of the within-cell prefill regression)."""

    __slots__ = ("raw", "n", "s", "sa", "saa", "sab", "sbb", "tok", "tpot", "sp", "st", "spt", "pn", "ps",
                 "mp", "mt")
    WEIGHTED = ("n", "s", "sa", "saa", "sab", "sbb", "tok", "tpot", "sp", "st", "spt", "pn", "ps")
    UNWEIGHTED = ("raw", "mp", "mt")

    def __init__(self) -> None:
        self.raw = 0
        self.n = self.s = self.sa = self.saa = self.sab = self.sbb = self.tok = self.tpot = 0.0
        self.sp = self.st = self.spt = self.pn = self.ps = 0.0
        self.mp: float | None = None
        self.mt = 0.0

    def observe(self, w: float, loss: float, tokens: int, t: float, p: int, normf: float, scale: float,
                batch: int, ratio_of_sums: bool) -> None:
        """Add one step: ``loss`` per token (normalised), ``t`` its time, ``p`` its prompt tokens,
        ``normf`` the batch normalisation and ``scale`` = normf / tokens.

        ``ratio_of_sums``: latency per token = total time / total tokens. The mean of per-step
        ratios (the paper's) overweights steps that emit one token (every draft rejected), so it
        ranks long drafts too low; s and sp hold the ratio times the count, so s / n reads it."""
        self.raw += 1
        self.n += w
        a = loss * tokens
        self.sa += w * a
        self.saa += w * a * a
        self.sab += w * a * tokens
        self.sbb += w * tokens * tokens
        self.tok += w * tokens
        if ratio_of_sums:
            self.st += w * t * normf
            self.spt += w * p * normf
            r = self.n / self.tok
            self.s = self.st * r
            self.sp = self.spt * r
        else:
            self.s += w * t * scale  # the mean of per-step losses
        self.tpot += w * t * max(1, batch) / tokens

    def tokens_per_step(self, default: float) -> float:
        """Mean tokens a step of this arm emits (``default`` before it has played)."""
        return max(self.tok / self.n if self.n > 0 else default, 1.0)


class Bucket:
    """The cells of one batch-size bucket, its discount weight and its priors' bookkeeping."""

    __slots__ = ("lo", "cells", "w", "t", "bmean", "has_prior", "dropped")

    def __init__(self, lo: int, arms: int) -> None:
        self.lo = lo
        self.cells = [Cell() for _ in range(arms)]
        self.w = 1.0
        self.t = 0  # observations
        self.bmean = float(lo)  # moving mean batch size
        self.has_prior = False
        # priors dropped for conflict: arm -> (prior mean, count), to recognise a level shift later
        self.dropped: dict[int, tuple[float, float]] = {}

    def count(self, i: int) -> float:
        """Effective observations of arm i (own evidence only)."""
        return self.cells[i].n / self.w

    def total(self) -> float:
        """Effective observations over all arms, priors included."""
        return (sum(x.n for x in self.cells) + sum(x.pn for x in self.cells)) / self.w

    def discount(self, steady: float, growing: bool) -> None:
        """Age the evidence after an observation. Growing-window forgetting: discount 1 - 1/(t + 10)
        for the t-th observation (weights grow linearly with recency, so a cold-start transient
        fades), floored at the configured discount (the tracking horizon in steady state). Priors
        are not a cold-start transient: they decay at the steady-state rate only."""
        self.t += 1
        d = min(steady, 1.0 - 1.0 / (self.t + 10.0)) if growing else steady
        if d < steady and self.has_prior:
            keep = steady / d
            for x in self.cells:
                x.pn *= keep
                x.ps *= keep
        if d < 1.0:
            w = self.w / d
            if w > _RESCALE_AT:
                self.rescale(w)
                w = 1.0
            self.w = w

    def rescale(self, w: float) -> None:
        """Divide every weighted field by ``w`` (keeps the scaled sums finite)."""
        for x in self.cells:
            for f in Cell.WEIGHTED:
                setattr(x, f, getattr(x, f) / w)

    def cvs(self) -> list[float]:
        """Relative noise of each arm's per-token mean, per observation (its standard error is
        cv / sqrt(n)): the arm's own estimate shrunk towards the bucket's pooled one (worth 3
        observations), so one outlier in a barely tried arm widens its interval instead of being
        trusted.

        The mean is a ratio of sums, R = sum(a) / sum(b) (a = a step's loss x tokens, b = its
        tokens), so the noise is that of the residuals a - R b over the mean b (the delta method):
        steps that emit many tokens weigh more. The spread of per-step losses about R is not that;
        with a per-step mean different from R it can come out negative and collapse the intervals."""
        inv = 1.0 / self.w
        own: list[float | None] = []
        num = den = 0.0
        for x in self.cells:
            if x.n * inv >= 2.0 and x.sa > 0:
                r = x.sa / x.tok
                v = max(x.saa - 2.0 * r * x.sab + r * r * x.sbb, 0.0) * x.n / (x.sa * x.sa)
                own.append(v)
                num += x.n * v
                den += x.n
            else:
                own.append(None)
        pooled = num / den if den > 0 else DEFAULT_CV**2
        out = []
        for x, o in zip(self.cells, own, strict=True):
            k = x.n * inv
            out.append(math.sqrt(pooled if o is None else (k * o + 3.0 * pooled) / (k + 3.0)))
        return out
