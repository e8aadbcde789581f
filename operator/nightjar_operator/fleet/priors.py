"""Fleet statistics -> planner priors (pure).

Each worker's planner exports its mean loss and count per (batch bucket, gamma). The fleet's
count-weighted means are a good starting belief for a new worker (it starts warm), but a prior must
not freeze learning: the pseudo-count of every entry is bounded (``max_pseudo_count``) so that a
worker's own observations outweigh the fleet's after a few dozen steps of that bucket.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nightjar_contract.planner import PlannerPriors, PriorEntry, bucket_index
from pydantic import BaseModel, ConfigDict, Field, field_validator


class PriorsConfig(BaseModel):
    """How fleet evidence becomes pseudo-counts."""

    model_config = ConfigDict(extra="forbid")

    weight: float = Field(0.25, description="pseudo-count per fleet observation before the cap")
    max_pseudo_count: float = Field(16.0, description="upper bound on the pseudo-count of any entry")
    min_fleet_count: float = Field(3.0, description="fleet entries with fewer observations are ignored (noise)")

    @field_validator("weight", "max_pseudo_count", "min_fleet_count")
    @classmethod
    def _nonneg(cls, v: float, info) -> float:
        if v < 0:
            raise ValueError(f"{info.field_name}: must be >= 0 (got {v})")
        return v


def merge_priors(
    fleet: Mapping[tuple[int, int], tuple[float, float]],
    bucket_edges: Iterable[int],
    arms: Iterable[int] | None = None,
    config: PriorsConfig | None = None,
    draft_prefill_s_per_token: float | None = None,
) -> PlannerPriors:
    """Build ``PlannerPriors`` on ``bucket_edges`` from fleet (bucket_lo, gamma) -> (mean loss, count).

    Fleet buckets are re-mapped onto ``bucket_edges`` (the bucket holding each fleet lower edge),
    merged with count weights; gammas outside ``arms`` are dropped; entries with too little
    evidence are skipped; every pseudo-count is ``min(max_pseudo_count, weight * count)``. The
    fleet's draft prefill price (seconds per prompt token) rides along as it is.
    """
    cfg = config or PriorsConfig()
    edges = sorted(bucket_edges)
    allowed = set(arms) if arms is not None else None
    loss: dict[tuple[int, int], float] = {}
    cnt: dict[tuple[int, int], float] = {}
    for (b, g), (mean, n) in fleet.items():
        if allowed is not None and g not in allowed:
            continue
        if not (mean > 0) or not (n > 0) or mean == float("inf"):
            continue
        key = (edges[bucket_index(edges, b)], g)
        loss[key] = loss.get(key, 0.0) + mean * n
        cnt[key] = cnt.get(key, 0.0) + n
    entries = []
    for key in sorted(cnt):
        n = cnt[key]
        if n < cfg.min_fleet_count:
            continue
        pseudo = min(cfg.max_pseudo_count, cfg.weight * n)
        if pseudo <= 0:
            continue
        entries.append(PriorEntry(bucket_lo=key[0], gamma=key[1], mean_loss_s=loss[key] / n, count=round(pseudo, 3)))
    return PlannerPriors(bucket_edges=edges, entries=entries, draft_prefill_s_per_token=draft_prefill_s_per_token)


def priors_equal(a: PlannerPriors | None, b: PlannerPriors | None, rel_tol: float = 0.02) -> bool:
    """True when pushing ``b`` over ``a`` would change nothing material (avoids rewriting the
    ConfigMap, and so reloading every worker, on every timer tick for noise-level changes)."""
    if a is None or b is None:
        return a is b
    if a.bucket_edges != b.bucket_edges or not _close(a.draft_prefill_s_per_token, b.draft_prefill_s_per_token, rel_tol):
        return False
    ea = {(e.bucket_lo, e.gamma): e for e in a.entries}
    eb = {(e.bucket_lo, e.gamma): e for e in b.entries}
    if ea.keys() != eb.keys():
        return False
    for k, x in ea.items():
        y = eb[k]
        if not _close(x.mean_loss_s, y.mean_loss_s, rel_tol):
            return False
        if abs(x.count - y.count) > max(1.0, rel_tol * max(x.count, y.count)):
            return False
    return True


def _close(x: float | None, y: float | None, rel_tol: float) -> bool:
    if x is None or y is None:
        return x is y
    return abs(x - y) <= rel_tol * max(x, y)
