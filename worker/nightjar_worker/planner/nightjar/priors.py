"""Priors: injected per (bucket, arm) evidence, and what to do when a worker's own evidence contradicts it.

Each prior entry is worth ``count`` observations of ``mean_loss_s`` (capped per bucket and arm, so
a worker's own evidence soon outweighs a wrong prior). ``reconcile`` runs at every new bin of a
bucket that has priors:

* Level shift: every arm with own evidence (two at least: one arm cannot tell a wrong level from a
  wrong arm) is off in the same direction, its dropped prior counted. The priors' shape across arms
  still holds and only their level is off (a slower machine, longer prompts, a batch that memory
  caps below the requests waiting), so all of the bucket's priors are rescaled by the
  evidence-weighted geometric mean of own / prior and the dropped ones come back. Dropping arm by
  arm instead made each arm whose prior was still standing look better than the arms already
  tried, and the bucket played them in turn.
* Otherwise the conflicting arms' priors are wrong for this worker and are dropped, so a wrong
  prior costs a few observations of that arm, not the time it takes the discount to erode it; they
  are kept aside to recognise a level shift later.

A dropped prior more than ``GROSS`` times off (``Verdict.gross``) says the fleet worked under other
conditions (another machine or pair): bucket by bucket only the arms the worker plays are judged,
and the others keep a prior wrong in level and shape (a CPU fleet's arms, 100x slower than this
worker's own gamma 0 once its prior was dropped, kept gamma 0 played for good), so the estimator
then forgets every prior (``clear``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from nightjar_contract.planner import PlannerPriors, bucket_index

from nightjar_worker.planner.nightjar.arms import ArmSet
from nightjar_worker.planner.nightjar.cells import Bucket


def load(buckets: list[Bucket], edges: tuple[int, ...], arms: ArmSet, priors: PlannerPriors,
         cap: float) -> None:
    """Replace every bucket's priors with ``priors`` (entries on other edges may share a bucket; an
    entry of a source or gamma the planner has no arm for is ignored)."""
    merged: dict[tuple[int, int], list[float]] = {}
    for e in priors.entries:
        i = arms.of(e.source, e.gamma)
        if i is not None and e.count > 0:
            acc = merged.setdefault((bucket_index(edges, e.bucket_lo), i), [0.0, 0.0])
            acc[0] += e.count
            acc[1] += e.count * e.mean_loss_s
    for bk in buckets:
        for x in bk.cells:
            x.clear_prior()
        bk.has_prior = False
        bk.dropped = {}
    for (c, i), (n, s) in merged.items():
        bk = buckets[c]
        k = min(n, cap) * bk.w
        bk.cells[i].prior_count = k
        bk.cells[i].prior_loss_sum = k * s / n
        bk.has_prior = True


@dataclass(frozen=True, slots=True)
class Verdict:
    rescaled: bool = False
    dropped: int = 0
    judged: int = 0  # arms with a standing prior and enough own evidence to be judged against it
    gross: bool = False  # a dropped prior was off by more than ``GROSS`` times
    forgotten: bool = False  # every bucket's priors were forgotten (``gross``)


def clear(buckets: list[Bucket]) -> int:
    """Forget every bucket's priors; returns how many (bucket, arm) priors stood."""
    n = 0
    for bk in buckets:
        for x in bk.cells:
            n += x.prior_count > 0
            x.clear_prior()
        bk.has_prior = False
        bk.dropped = {}
    return n


GROSS = 4.0  # a prior this many times off its arm's own mean is no noise: another machine or pair


def reconcile(bk: Bucket, corrected: list[float], cvs: Callable[[], list[float]], z: float) -> Verdict:
    """Prior-data conflict in one bucket: an arm's own mean lies outside what its prior allows (z
    standard errors of both, with the bucket's own noise). ``corrected``: the bucket's loss sums
    with prefill taken out; ``cvs``: its per-arm noise (computed only when needed)."""
    inv = 1.0 / bk.w
    cells, dropped = bk.cells, bk.dropped
    cv = None
    judged = []  # (arm, own mean, prior mean, own count, conflicts)
    for i, x in enumerate(cells):
        k = x.count * inv
        if k < 2.0 or corrected[i] <= 0:
            continue
        if x.prior_count > 0:
            prior, kp = x.prior_loss_sum / x.prior_count, x.prior_count * inv
        elif i in dropped:
            prior, kp = dropped[i]
        else:
            continue
        if cv is None:
            cv = cvs()
        own = corrected[i] / x.count
        bad = abs(own - prior) > z * cv[i] * max(own, prior) * math.sqrt(1.0 / k + 1.0 / kp)
        judged.append((i, own, prior, k, bad))
    live = sum(1 for i, *_ in judged if cells[i].prior_count > 0)
    if not any(bad and cells[i].prior_count > 0 for i, _, _, _, bad in judged):
        return Verdict(judged=live)
    verdict = Verdict(judged=live)
    same_way = len({own > prior for _, own, prior, _, _ in judged}) == 1
    if len(judged) >= 2 and same_way and all(bad for *_, bad in judged):
        weight = sum(k for _, _, _, k, _ in judged)
        r = math.exp(sum(k * math.log(own / prior) for _, own, prior, k, _ in judged) / weight)
        for x in cells:
            x.prior_loss_sum *= r
        for i, (prior, kp) in dropped.items():
            cells[i].prior_count = kp * bk.w
            cells[i].prior_loss_sum = cells[i].prior_count * prior * r
        dropped.clear()
        verdict = Verdict(rescaled=True, judged=live)
    else:
        n, gross = 0, False
        for i, own, prior, _, bad in judged:
            if bad and cells[i].prior_count > 0:
                dropped[i] = (prior, cells[i].prior_count * inv)
                cells[i].clear_prior()
                n += 1
                gross = gross or max(own / prior, prior / own) > GROSS
        verdict = Verdict(dropped=n, judged=live, gross=gross)
    bk.has_prior = any(x.prior_count > 0 for x in cells)
    return verdict
