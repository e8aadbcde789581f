"""What an exploration bin plays: the paper's uniform draw, or Nightjar's pruned, optimistic pick.

``PrunedExplorer`` (beyond the paper):
  * ``monotone``: the draft model's best gamma does not grow with batch size, so exploration of
    draft arms in a bucket is confined between the best arms of established neighbours on either side;
  * ``eliminate``: only arms whose confidence interval still overlaps the best arm's (successive
    elimination inside the paper's schedule), least-tried first; a barely known arm stays in unless
    flipping speculation alone costs more than half of what the best arm loses;
  * arms the bucket has not tried itself come first (neighbour evidence is only a guess), then the
    lowest lower confidence bound;
  * doubling: an arm with n observations is held at most n + 1 steps, so a barely known (possibly
    bad) arm never gets a whole long bin;
  * with the source model's predictions (``sourcemodel.py``, ``source_model``): a barely known arm
    predicted to lose by more than ``PRED_MARGIN`` to the best arm's upper bound is not explored,
    and untried arms go in order of predicted loss (those without a prediction first: they anchor
    the lines), instead of a draw that at a full batch played n-gram gamma 4 (1.8x gamma 0) as
    readily as gamma 1.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from nightjar_worker.planner.nightjar.arms import ArmSet
from nightjar_worker.planner.nightjar.estimates import Estimator
from nightjar_worker.planner.nightjar.flips import FlipPricer
from nightjar_worker.planner.nightjar.schedule import Schedule

_ESTABLISHED = 32.0  # effective observations before a bucket's best arm constrains its neighbours
MIN_ELIMINATE = 4.0  # an arm is never ruled out on fewer (effective) observations
SOURCE_MARGIN = 0.25  # a source whose tried gammas all lose by more than this has its others skipped
PRED_MARGIN = 0.1  # a predicted loss this much (relative) above the best arm's upper bound is skipped


@dataclass
class Candidates:
    """One bucket's arms at a new bin: candidates (SLO- and gate-feasible), means, effective
    counts, means with the switching penalty (``eff``), and the exploit arm (-1 if none)."""

    c: int
    cand: list[int]
    means: list[float | None]
    counts: list[float]
    eff: list[float | None]
    best: int
    pred: list[float | None] | None = None  # the source model's predicted loss, switching penalty included
    bound: list[float | None] | None = None  # the same at each source's optimistic acceptance (what prunes)


def unknown_source(arms: ArmSet, cand: list[int], means: list[float | None], pred: list[float | None] | None) -> bool:
    """With the source model (``pred``): whether some source (gamma 0 counting as one) has a candidate
    arm but no estimate of any of its arms in this bucket, measured, borrowed or predicted. Such a
    bucket explores whatever its schedule says: exploiting the one arm a cold bucket happened to try
    first (a draft arm at 1.5x the best loss) until a later exploration bin comes was the other
    large cost of a cold start."""
    if pred is None:
        return False
    known: dict[str, bool] = {}
    for i in cand:
        key = arms.source[i] if arms.gamma[i] > 0 else ""
        known[key] = known.get(key, False) or means[i] is not None or pred[i] is not None
    return not all(known.values())


class UniformExplorer:
    """The paper's: a uniformly drawn candidate, held for the whole bin."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def configure(self, *, monotone: bool, eliminate: bool, z: float, source_first: bool = True) -> None:
        """Nothing to set: the paper's draw has no knobs."""

    def choose(self, k: Candidates, on_now: bool) -> int | None:
        return self.rng.choice(k.cand) if k.cand else None

    def hold(self, k: Candidates, choice: int, left: int, raising: bool) -> int:
        return left


@dataclass
class PrunedExplorer:
    """Reads the evidence (``est``) and the neighbours' exploit arms (``schedules``); owns nothing
    but its knobs."""

    rng: random.Random
    arms: ArmSet
    est: Estimator
    schedules: Sequence[Schedule]
    flips: FlipPricer
    z: float = 2.0
    monotone: bool = True
    eliminate: bool = True
    source_first: bool = True

    def configure(self, *, monotone: bool, eliminate: bool, z: float, source_first: bool = True) -> None:
        self.monotone, self.eliminate, self.z, self.source_first = monotone, eliminate, z, source_first

    def choose(self, k: Candidates, on_now: bool) -> int | None:
        """The arm to explore, or None when nothing is worth it."""
        pool = self._pool(k, on_now)
        return self._pick(k, pool) if pool else None

    def hold(self, k: Candidates, choice: int, left: int, raising: bool) -> int:
        """Steps to hold ``choice`` after this one: at most its count (raising gamma one more: the
        pipeline-fill step is not observed)."""
        hold = min(left, int(k.counts[choice]))
        return max(hold, 1) if raising else hold

    def _pool(self, k: Candidates, on_now: bool) -> list[int]:
        c, best, eff, counts = k.c, k.best, k.eff, k.counts
        pool = list(k.cand)
        if self.monotone:
            hi = self._neighbour_best(c, -1)  # best gamma of a smaller-batch bucket: upper bound
            lo = self._neighbour_best(c, +1)  # best gamma of a larger-batch bucket: lower bound
            g, src = self.arms.gamma, self.arms.source
            pruned = [i for i in pool if src[i] != "draft"  # the prior is about the draft model's gamma
                      or ((hi is None or g[i] <= hi) and (lo is None or g[i] >= lo))]
            if pruned:
                pool = pruned
        best_eff = eff[best] if best >= 0 else None
        if self.eliminate and best_eff is not None:
            z = self.z
            cv = self.est.cvs(c)
            b_ucb = best_eff * (1.0 + z * cv[best] / math.sqrt(max(counts[best], 1e-9)))
            pen, visit = self.flips.penalty, self.flips.visit

            bound = k.bound

            def overlaps(i: int) -> bool:
                e = eff[i]
                if e is not None and counts[i] >= MIN_ELIMINATE:
                    return e * (1.0 - z * cv[i] / math.sqrt(counts[i])) <= b_ucb
                p = bound[i] if bound is not None and i != best else None
                if p is not None and p * (1.0 - PRED_MARGIN) > b_ucb:
                    return False
                return pen(c, i, on_now, visit(int(counts[i]) + 1), int(counts[i]) + 1) <= 0.5 * b_ucb

            pool = [i for i in pool if overlaps(i)]
            if pool == [best]:
                return []
        # several sources: without the source model, a source losing on its tried gammas is skipped
        # (with it, its predictions do that, and a gamma tried once with an unlucky draw does not)
        if self.source_first and best_eff is not None and k.pred is None and len(set(self.arms.source)) > 1:
            pool = self._sources_worth_trying(k, pool, best_eff)
            if pool == [best] or not pool:
                return []
        return pool

    def _sources_worth_trying(self, k: Candidates, pool: list[int], best_eff: float) -> list[int]:
        """Source, then gamma: a source's untried gammas are not explored in a bucket where every
        gamma of it tried there loses to the best arm by more than ``SOURCE_MARGIN`` (a source's
        loss is unimodal in gamma and its gammas share the acceptance, so one clearly losing gamma
        says the others lose too; a cold bucket would otherwise try every arm of every source)."""
        src, g, eff = self.arms.source, self.arms.gamma, k.eff
        tried: dict[str, float] = {}
        for i in range(len(eff)):
            e = eff[i]
            if g[i] > 0 and e is not None and not self.est.untried(k.c, i):
                tried[src[i]] = min(tried.get(src[i], math.inf), e)
        bar = best_eff * (1.0 + SOURCE_MARGIN)
        return [i for i in pool
                if g[i] == 0 or not self.est.untried(k.c, i) or tried.get(src[i], -math.inf) <= bar]

    def _pick(self, k: Candidates, pool: list[int]) -> int:
        if k.best < 0 and k.pred is not None:  # a bucket with no evidence at all: its neighbour's choice first
            nb = self._nearest_best(k.c)
            if nb in pool:
                return nb
        others = [i for i in pool if i != k.best] or pool
        untried = [i for i in others if self.est.untried(k.c, i)]
        if untried and self.source_first:  # a source not tried in this bucket first
            src = self.arms.source
            seen = {src[i] for i in range(len(self.arms)) if self.arms.gamma[i] > 0 and not self.est.untried(k.c, i)}
            untried = [i for i in untried if src[i] not in seen] or untried
        if untried and k.pred is not None:  # the source model: unpredicted ones first, then the lowest prediction
            pred = k.pred
            unknown = [i for i in untried if pred[i] is None]
            if not unknown:
                return min(untried, key=lambda i: pred[i] or 0.0)
            untried = unknown
        if untried:
            return untried[0] if len(untried) == 1 else self.rng.choice(untried)
        z, cv, eff, counts = self.z, self.est.cvs(k.c), k.eff, k.counts

        def lcb(i: int) -> float:
            e = eff[i]
            return -math.inf if e is None else e * (1.0 - z * cv[i] / math.sqrt(counts[i]))

        return min(others, key=lcb)

    def _nearest_best(self, c: int) -> int:
        """The exploit arm of the nearest bucket that has one (the smaller first at equal distance:
        the batch usually comes from there); -1 if none. The best arm moves little from one bucket to
        the next, and a first visit to a random arm at a full batch (a draft arm: C_switch and 1.6x
        the loss) was the largest single cost of a cold start at saturation."""
        for dist in range(1, len(self.schedules)):
            for d in (c - dist, c + dist):
                if 0 <= d < len(self.schedules) and self.schedules[d].best >= 0:
                    return self.schedules[d].best
        return -1

    def _neighbour_best(self, c: int, step: int) -> int | None:
        d = c + step
        while 0 <= d < len(self.est):
            best = self.schedules[d].best
            if self.est.total(d) >= _ESTABLISHED and best >= 0:  # priors are evidence too
                return self.arms.gamma[best] if self.arms.source[best] == "draft" else None
            d += step
        return None
