"""Statistics shared across a source's gammas (``source_model``): what an untried arm would cost.

With 9+ arms (gamma 0, the draft model's gammas, each host source's) a cold bucket that tries every
arm pays for the bad ones: on the roofline profile at a full batch n-gram gamma 4 costs 1.8x gamma
0 per token, and a bucket visited for a few hundred steps cannot afford the 4+ steps elimination
needs per arm. But an arm's loss is not a free parameter: it is the step time over the tokens per
request, and both have structure across a source's gammas.

* **Yield.** A source's drafts are accepted at a rate that is the source's and the content's, not
  the gamma's: under the geometric model a request gets ``1 + d + alpha + ... + alpha^g`` tokens per
  step of gamma g (``d``: the first tokens of prompts admitted into the step, gamma 0's yield less
  1). One alpha per source is fitted to the tokens and requests ``TokenYield`` pools over every
  bucket and every gamma of the source (moment matching), so every step of the source teaches all
  of its gammas. Until an arm has ``TokenYield.min_requests`` requests of its own pooled, its yield
  is that pooled yield shrunk towards the prediction (worth as many requests); from then on its own:
  a mix of geometric categories is 1-2 % off one alpha, which tipped near ties in steady state
  (Qwen profile, sources regret run: final regret +3.5 %, exponent 0.44 -> 0.60, with the shrinkage
  kept on). A source whose well-measured
  gammas disagree with the fit by more than ``CHECK_TOLERANCE`` goes without the model (yields and
  predictions), so a wrong model cannot keep an arm out for good.
* **Step time.** Within a bucket a source's step time per request is close to linear in gamma
  (the drafts are extra positions to verify, plus the proposer's own forwards), and gamma 0 is
  shared by every source. So two tried points of a source's line (gamma 0 and one gamma, or two
  gammas) give every other gamma's time: interpolated between tried gammas, extrapolated with the
  slope of the last two (convex in gamma where the step turns compute-bound, so the extrapolation
  is optimistic, and an optimistic guess is explored rather than wrongly pruned).

The predicted loss is that time over that yield. The explorer ranks untried arms by it and skips
those predicted clearly worse than the best arm's upper bound (``explore.py``); exploitation reads
only measured evidence.
"""

from __future__ import annotations

from nightjar_worker.planner.nightjar.arms import ArmSet
from nightjar_worker.planner.nightjar.yields import TokenYield


def accepted_per_request(gamma: int, alpha: float) -> float:
    """Expected accepted drafts per request at ``gamma`` under the geometric model: alpha + ... +
    alpha^gamma, in closed form (the fit evaluates it 24 times per point at every new bin)."""
    if alpha >= 1.0:
        return float(gamma)
    return alpha * (1.0 - alpha**gamma) / (1.0 - alpha)


def fit_alpha(points: list[tuple[int, float, float]]) -> float:
    """The geometric alpha whose expected accepted drafts match the observed ones over
    ``points`` = (gamma, requests, accepted drafts) (every gamma > 0): the moment equation
    sum R_g S_g(alpha) = sum A_g is increasing in alpha, solved by bisection; clamped to [0, 0.99]."""
    target = sum(a for _, _, a in points)
    if target <= 0:
        return 0.0
    if target >= sum(r * g for g, r, _ in points):
        return 0.99
    lo, hi = 0.0, 0.99
    for _ in range(24):  # 0.99 / 2^24: alpha to 6e-8, far below any estimate's noise
        mid = 0.5 * (lo + hi)
        if sum(r * accepted_per_request(g, mid) for g, r, _ in points) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def line_at(points: list[tuple[int, float]], g: int) -> float | None:
    """A step time at gamma ``g`` from a source's tried (gamma, time) points (ascending gamma,
    distinct): linear between the two around ``g``, or beyond the tried range along the last (or
    first) two points' slope, never below zero slope; None with fewer than two points."""
    if len(points) < 2:
        return None
    lo = [p for p in points if p[0] <= g]
    hi = [p for p in points if p[0] >= g]
    if lo and hi:
        (g0, t0), (g1, t1) = lo[-1], hi[0]
        return t0 if g1 == g0 else t0 + (t1 - t0) * (g - g0) / (g1 - g0)
    (g0, t0), (g1, t1) = (points[-2], points[-1]) if lo else (points[0], points[1])
    slope = max((t1 - t0) / (g1 - g0), 0.0)
    return t1 + slope * (g - g1) if lo else max(t0 - slope * (g0 - g), 0.0)


FIT_DRAFTS = 16.0  # drafted tokens a source needs (pooled over its gammas) before its alpha is fitted
# The model check: a gamma with this many requests pooled whose yield is this far (relative) from the
# fit says acceptance is not geometric here, and the source goes without the model. A mix of
# categories, each geometric, is within 2 % of one alpha on every calibrated source; the yield of
# 128 requests has a few % of noise.
CHECK_REQUESTS, CHECK_TOLERANCE = 128.0, 0.08


class SourceModel:
    """Reads the pooled yields (``TokenYield``); owns the fitted alpha per source (cached until the
    yields move)."""

    def __init__(self, arms: ArmSet, yields: TokenYield) -> None:
        self.arms = arms
        self.yields = yields
        self._plain = arms.of("draft", 0)
        self._by_source: dict[str, list[int]] = {}
        for i, (s, g) in enumerate(arms.keys):
            if g > 0:
                self._by_source.setdefault(s, []).append(i)
        self._seen = -1
        self._alpha: dict[str, float | None] = {}
        self._alpha_hi: dict[str, float] = {}  # an upper confidence bound (z = 2) on each fitted alpha
        self._extra = 0.0

    def _refresh(self) -> None:
        y = self.yields
        if self._seen == y.steps:
            return
        self._seen = y.steps
        extra = 0.0  # tokens per request a gamma 0 step emits beyond 1 (first tokens of admitted prompts)
        if self._plain is not None:
            p = y.per_request(self._plain)
            extra = max(p - 1.0, 0.0) if p is not None else 0.0
        self._extra = extra
        for s, idx in self._by_source.items():
            pts = [(self.arms.gamma[i], y.requests[i], max(y.tokens[i] - (1.0 + extra) * y.requests[i], 0.0))
                   for i in idx if y.requests[i] > 0]
            a = fit_alpha(pts) if sum(r * g for g, r, _ in pts) >= FIT_DRAFTS else None
            if a is not None and any(  # the model check: a gamma well measured and far off, no model
                    r >= CHECK_REQUESTS and abs((1.0 + extra + acc / r) / (1.0 + extra + accepted_per_request(g, a)) - 1.0)
                    > CHECK_TOLERANCE for g, r, acc in pts):
                a = None
            self._alpha[s] = a
            if a is not None:  # the accepted count's upper bound (Poisson, z = 2) over the same requests
                acc = sum(x for _, _, x in pts)
                f = (acc + 2.0 * acc**0.5 + 4.0) / acc if acc > 0 else 0.0
                self._alpha_hi[s] = fit_alpha([(g, r, x * f if acc > 0 else 4.0 * r / sum(q for _, q, _ in pts))
                                               for g, r, x in pts])

    def alpha(self, source: str) -> float | None:
        """The source's fitted alpha; None until its gammas have ``FIT_DRAFTS`` drafts pooled."""
        self._refresh()
        return self._alpha.get(source)

    def per_request(self, i: int, optimistic: bool = False) -> float | None:
        """Arm i's tokens per request per step: its own pooled yield once it has ``min_requests``
        requests, before that shrunk towards the source's geometric prediction (worth ``min_requests``
        requests; ``optimistic``: at alpha's upper bound, what
        pruning reads, so a source fitted on a few unlucky draws is not ruled out for good); gamma 0
        and sources without a fit: the pooled yield alone (None below ``min_requests``)."""
        self._refresh()
        y = self.yields
        if y.requests[i] >= y.min_requests and not optimistic:
            return y.per_request(i)  # enough of its own: the fit's few per cent of bias would tip near ties
        a = self._alpha.get(self.arms.source[i]) if self.arms.gamma[i] > 0 else None
        if a is not None and optimistic:
            a = self._alpha_hi.get(self.arms.source[i], a)
        if a is None:
            return y.per_request(i)
        geo = 1.0 + self._extra + accepted_per_request(self.arms.gamma[i], a)
        k = y.min_requests
        return (y.tokens[i] + k * geo) / (y.requests[i] + k)

    def rescale(self, i: int, own_per_request: float | None) -> float:
        """The factor turning a cell's loss over its own yield into one over ``per_request(i)``."""
        pooled = self.per_request(i)
        if pooled is None or own_per_request is None or own_per_request <= 0:
            return 1.0
        return own_per_request / pooled

    def relative_slopes(self, times: list[float | None]) -> dict[str, float]:
        """Per source with gamma 0 and a gamma of it tried in a bucket (``times`` as in ``predict``):
        its step time's growth per drafted token relative to gamma 0's (least squares through the
        origin of t_g / t_0 - 1 on g, floored at 0)."""
        t0 = times[self._plain] if self._plain is not None else None
        out: dict[str, float] = {}
        if t0 is None or t0 <= 0:
            return out
        for s, idx in self._by_source.items():
            num = den = 0.0
            for i in idx:
                t = times[i]
                if t is not None:
                    g = self.arms.gamma[i]
                    num += g * (t / t0 - 1.0)
                    den += g * g
            if den > 0:
                out[s] = max(num / den, 0.0)
        return out

    def predict(self, times: list[float | None], borrowed: dict[str, float] | None = None,
                optimistic: bool = False) -> list[float | None]:
        """Per arm, its loss predicted from a bucket's step times per request (``times``: measured
        where the arm has played in the bucket, None elsewhere): each source's line through gamma 0
        and its tried gammas, over ``per_request``; a source with no gamma tried here but gamma 0
        tried uses a neighbouring bucket's relative slope (``borrowed``, ``relative_slopes``; the
        draft's forwards weigh less as the batch grows, the verification more, so the nearest
        bucket's is a guess, checked by the first visit). None where the line or the yield is
        missing; arms with a measured time get their own time over the yield. ``optimistic``: the
        yields at alpha's upper bound (``per_request``)."""
        out: list[float | None] = [None] * len(times)
        t0 = times[self._plain] if self._plain is not None else None
        for s, idx in self._by_source.items():
            pts = ([(0, t0)] if t0 is not None else []) + [
                (self.arms.gamma[i], t) for i in idx if (t := times[i]) is not None]
            pts.sort()
            rel = borrowed.get(s) if borrowed and t0 is not None and len(pts) == 1 else None
            for i in idx:
                t = times[i]
                if t is None:
                    g = self.arms.gamma[i]
                    t = line_at(pts, g) if rel is None or t0 is None else t0 * (1.0 + rel * g)
                y = self.per_request(i, optimistic)
                if t is not None and y is not None and y > 0:
                    out[i] = t / y
        return out
