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
# Priors fade with this half-life in observations of their bucket (Nightjar's growing-window scheme):
# a fleet prior is worth up to 64 observations so that it settles near ties and keeps arms the fleet
# ruled out from being re-explored, but a pessimistic wrong prior is never contradicted by the
# worker (its arm is not played), so only fading lets it be explored again.
PRIOR_HALFLIFE = 300.0
_PRIOR_FADE = 0.5 ** (1.0 / PRIOR_HALFLIFE)


def less_prefill(loss_sum: float, prompt_tokens: float, slope: float) -> float:
    """A loss sum less its prompt tokens' learnt prefill cost, floored at 5 % so a slope fitted
    too steep never makes an arm look free."""
    return max(loss_sum - slope * prompt_tokens, 0.05 * loss_sum)


class Cell:
    """One arm in one bucket. Weighted sums (scaled by the bucket's ``w``):

    ``count``: effective observations; ``loss_sum``: loss sum (mean = loss_sum / count);
    ``prompt_sum``: prompt tokens per generated token x count (the prefill the loss sum carries);
    ``time_sum``, ``prompt_tok_sum``: sums of step time and prompt tokens whose ratios to
    ``tok_sum`` give loss_sum / count and prompt_sum / count; ``cost_sum``, ``cost_sq_sum``,
    ``cost_tok_sum``, ``tok_sq_sum``: sums of a, a^2, a*b, b^2 (a = a step's cost, its loss x
    tokens; b = its tokens) for the noise of the ratio-of-sums mean; ``tok_sum``: tokens;
    ``req_sum``: requests (batch sizes); ``prior_count``, ``prior_loss_sum``: the prior's
    count and loss sum (same scaling).
    Not weighted: ``steps`` (undiscounted observations), ``prompt_centre``, ``time_centre``
    (moving means of the cell's prompt tokens and step time, the centre of the within-cell
    prefill regression)."""

    __slots__ = ("steps", "count", "loss_sum", "cost_sum", "cost_sq_sum", "cost_tok_sum", "tok_sq_sum",
                 "tok_sum", "prompt_sum", "time_sum", "prompt_tok_sum", "prior_count",
                 "prior_loss_sum", "prompt_centre", "time_centre", "req_sum")
    WEIGHTED = ("count", "loss_sum", "cost_sum", "cost_sq_sum", "cost_tok_sum", "tok_sq_sum", "tok_sum",
                "prompt_sum", "time_sum", "prompt_tok_sum", "prior_count", "prior_loss_sum", "req_sum")
    UNWEIGHTED = ("steps", "prompt_centre", "time_centre")

    def __init__(self) -> None:
        self.steps = 0
        self.count = self.loss_sum = self.cost_sum = self.cost_sq_sum = self.cost_tok_sum = 0.0
        self.tok_sq_sum = self.tok_sum = self.req_sum = 0.0
        self.prompt_sum = self.time_sum = self.prompt_tok_sum = self.prior_count = self.prior_loss_sum = 0.0
        self.prompt_centre: float | None = None
        self.time_centre = 0.0

    def observe(self, w: float, *, loss: float, tokens: int, time_s: float, prompt_tokens: int, normf: float,
                batch: int, ratio_of_sums: bool) -> None:
        """Add one step: ``loss`` per token (normalised), ``time_s`` its time, ``prompt_tokens`` its
        prompt tokens, ``normf`` the batch normalisation.

        ``ratio_of_sums``: latency per token = total time / total tokens. The mean of per-step
        ratios (the paper's) overweights steps that emit one token (every draft rejected), so it
        ranks long drafts too low; loss_sum and prompt_sum hold the ratio times the count, so
        loss_sum / count reads it."""
        t, p = time_s, prompt_tokens
        self.steps += 1
        self.count += w
        a = loss * tokens
        self.cost_sum += w * a
        self.cost_sq_sum += w * a * a
        self.cost_tok_sum += w * a * tokens
        self.tok_sq_sum += w * tokens * tokens
        self.tok_sum += w * tokens
        self.req_sum += w * max(1, batch)
        if ratio_of_sums:
            self.time_sum += w * t * normf
            self.prompt_tok_sum += w * p * normf
            r = self.count / self.tok_sum
            self.loss_sum = self.time_sum * r
            self.prompt_sum = self.prompt_tok_sum * r
        else:
            self.loss_sum += w * t * (normf / tokens)  # the mean of per-step losses

    def tokens_per_step(self, default: float) -> float:
        """Mean tokens a step of this arm emits (``default`` before it has played)."""
        return max(self.tok_sum / self.count if self.count > 0 else default, 1.0)

    def tokens_per_request(self) -> float | None:
        """Mean tokens a request gets per step of this arm in this cell (None before it has played)."""
        return self.tok_sum / self.req_sum if self.req_sum > 0 else None

    def clear_prior(self) -> None:
        self.prior_count = self.prior_loss_sum = 0.0


class Bucket:
    """The cells of one batch-size bucket, its discount weight and its priors' bookkeeping."""

    __slots__ = ("lo", "cells", "w", "observed", "mean_batch", "has_prior", "dropped")

    def __init__(self, lo: int, arms: int) -> None:
        self.lo = lo
        self.cells = [Cell() for _ in range(arms)]
        self.w = 1.0
        self.observed = 0  # observations
        self.mean_batch = float(lo)  # moving mean batch size
        self.has_prior = False
        # priors dropped for conflict: arm -> (prior mean, count), to recognise a level shift later
        self.dropped: dict[int, tuple[float, float]] = {}

    def count(self, i: int) -> float:
        """Effective observations of arm i (own evidence only)."""
        return self.cells[i].count / self.w

    def total(self) -> float:
        """Effective observations over all arms, priors included."""
        return (sum(x.count for x in self.cells) + sum(x.prior_count for x in self.cells)) / self.w

    def note_batch(self, batch: int) -> None:
        """A step observed at ``batch``: moves the bucket's typical batch."""
        self.mean_batch += 0.05 * (batch - self.mean_batch)

    def prior_steps(self) -> int:
        """Steps the bucket's priors are worth (what its exploration schedule skips)."""
        return int(sum(x.prior_count for x in self.cells) / self.w)

    def discount(self, steady: float, growing: bool) -> None:
        """Age the evidence after an observation. Growing-window forgetting: discount 1 - 1/(t + 10)
        for the t-th observation (weights grow linearly with recency, so a cold-start transient
        fades), floored at the configured discount (the tracking horizon in steady state). Priors
        are not a cold-start transient: they decay at the steady-state rate, and with the growing
        window also with a half-life of ``PRIOR_HALFLIFE`` observations (a prior is a warm start,
        not a standing belief)."""
        self.observed += 1
        d = min(steady, 1.0 - 1.0 / (self.observed + 10.0)) if growing else steady
        if growing and self.has_prior:
            keep = steady / d * _PRIOR_FADE
            for x in self.cells:
                x.prior_count *= keep
                x.prior_loss_sum *= keep
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

        The mean is a ratio of sums, R = sum(a) / sum(b) (a = a step's cost, loss x tokens, b = its
        tokens), so the noise is that of the residuals a - R b over the mean b (the delta method):
        steps that emit many tokens weigh more. The spread of per-step losses about R is not that;
        with a per-step mean different from R it can come out negative and collapse the intervals."""
        inv = 1.0 / self.w
        own: list[float | None] = []
        num = den = 0.0
        for x in self.cells:
            if x.count * inv >= 2.0 and x.cost_sum > 0:
                r = x.cost_sum / x.tok_sum
                v = (max(x.cost_sq_sum - 2.0 * r * x.cost_tok_sum + r * r * x.tok_sq_sum, 0.0) * x.count
                     / (x.cost_sum * x.cost_sum))
                own.append(v)
                num += x.count * v
                den += x.count
            else:
                own.append(None)
        pooled = num / den if den > 0 else DEFAULT_CV**2
        out = []
        for x, o in zip(self.cells, own, strict=True):
            k = x.count * inv
            out.append(math.sqrt(pooled if o is None else (k * o + 3.0 * pooled) / (k + 3.0)))
        return out
