"""Tokens per request per step of each arm, pooled over every bucket.

A step's loss is its time over its tokens. The time is a property of the (bucket, arm) cell and
varies by a few per cent; the tokens are a geometric draw per request (accepted drafts + 1) that
varies by tens of per cent from step to step, and their mean is a property of the arm's source, its
gamma and the content, not of the batch size. So the tokens a request gets per step of an arm are
pooled over all buckets (every step of the arm teaches every bucket), and a cell's mean loss is
read as its time per request over the pooled yield instead of over its own few draws (``Estimator``
rescales each cell's loss by its own yield / the pooled one). With 9+ arms split over 15 buckets a
cell sees few steps, and its own token draws were what kept near-tied arms (n-gram gamma 1 against
2, 3.7 % apart) from separating.

The pooled counts decay (half-life in steps, as the acceptance gate), so a change of content is
followed.
"""

from __future__ import annotations


class TokenYield:
    __slots__ = ("tokens", "requests", "decay", "min_requests", "steps")

    def __init__(self, arms: int, *, halflife_steps: int = 4096, min_requests: float = 32.0) -> None:
        self.tokens = [0.0] * arms  # tokens emitted by the arm's steps (decaying)
        self.requests = [0.0] * arms  # requests in those steps (batch sizes summed, decaying)
        self.decay = 0.5 ** (1.0 / halflife_steps)
        self.min_requests = min_requests  # below this, no pooled yield: the cell's own stands
        self.steps = 0  # observations (what readers' caches key on)

    def observe(self, i: int, tokens: int, batch: int) -> None:
        """A steady-state step of arm i: ``tokens`` emitted by ``batch`` requests; every arm ages."""
        self.steps += 1
        d = self.decay
        for j in range(len(self.tokens)):
            self.tokens[j] *= d
            self.requests[j] *= d
        self.tokens[i] += tokens
        self.requests[i] += max(1, batch)

    def per_request(self, i: int) -> float | None:
        """Arm i's pooled tokens per request per step; None until it has ``min_requests``."""
        n = self.requests[i]
        return self.tokens[i] / n if n >= self.min_requests else None

    def rescale(self, i: int, own_per_request: float | None) -> float:
        """The factor turning a cell's loss over its own yield into one over the pooled yield."""
        pooled = self.per_request(i)
        if pooled is None or own_per_request is None or own_per_request <= 0:
            return 1.0
        return own_per_request / pooled
