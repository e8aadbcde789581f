"""Fleet statistics -> planner priors (pure).

Each worker's planner exports its mean loss and count per (batch bucket, gamma, source): the
draft model's arms and each host source's (n-gram, suffix), whose losses are measured apart. The fleet's
count-weighted means are a good starting belief for a new worker (it starts warm). Every entry the
fleet measured is worth ``min_pseudo_count`` observations at least: the workers' counts are
discounted, so an arm they ruled out early (gamma 0 at batch 1) decays towards a count of zero
while its mean still holds, and a floor-less weight re-taught every new worker to explore it
(2.4 ms of regret a step there); a near tie also needs more than a few dozen pseudo-observations
to stay settled against per-step noise of ~50 %. A prior must still not freeze learning; that is
the planner's part: it drops a prior its own evidence contradicts and fades every prior with a
half-life (docs/planner.md, "Priors"). Pseudo-counts are bounded by ``max_pseudo_count``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nightjar_contract.planner import PlannerPriors, PriorEntry, bucket_index
from pydantic import BaseModel, ConfigDict, Field, field_validator


class PriorsConfig(BaseModel):
    """How fleet evidence becomes pseudo-counts."""

    model_config = ConfigDict(extra="forbid")

    weight: float = Field(0.25, description="pseudo-count per fleet observation before the floor and the cap")
    max_pseudo_count: float = Field(64.0, description="upper bound on the pseudo-count of any entry")
    min_pseudo_count: float = Field(
        64.0, description="floor on the pseudo-count of any entry kept (the fleet's counts are discounted)"
    )
    min_fleet_count: float = Field(0.0, description="fleet entries with fewer observations are ignored (noise)")

    @field_validator("weight", "max_pseudo_count", "min_pseudo_count", "min_fleet_count")
    @classmethod
    def _nonneg(cls, v: float, info) -> float:
        if v < 0:
            raise ValueError(f"{info.field_name}: must be >= 0 (got {v})")
        return v


def merge_priors(
    fleet: Mapping[tuple[int, int] | tuple[int, int, str], tuple[float, float]],
    bucket_edges: Iterable[int],
    arms: Iterable[int] | None = None,
    config: PriorsConfig | None = None,
    draft_prefill_s_per_token: float | None = None,
    host_arms: Mapping[str, Iterable[int]] | None = None,
) -> PlannerPriors:
    """Build ``PlannerPriors`` on ``bucket_edges`` from fleet (bucket_lo, gamma, source) -> (mean
    loss, count) (a key without a source is the draft model's).

    Fleet buckets are re-mapped onto ``bucket_edges`` (the bucket holding each fleet lower edge),
    merged with count weights per source; the draft's gammas outside ``arms`` are dropped, and a host
    source's outside ``host_arms`` (when given; gamma 0 is the plain arm, the draft's key); entries with too little
    evidence are skipped; every pseudo-count is ``weight * count`` within ``[min_pseudo_count,
    max_pseudo_count]``. The
    fleet's draft prefill price (seconds per prompt token) rides along as it is.
    """
    cfg = config or PriorsConfig()
    edges = sorted(bucket_edges)
    allowed = set(arms) if arms is not None else None
    hosts = {src: set(gs) for src, gs in host_arms.items()} if host_arms is not None else None
    loss: dict[tuple[int, int, str], float] = {}
    cnt: dict[tuple[int, int, str], float] = {}
    for fkey, (mean, n) in fleet.items():
        b, g = fkey[0], fkey[1]
        src = "draft" if g == 0 or len(fkey) < 3 else str(fkey[-1])
        if src == "draft" and allowed is not None and g not in allowed:
            continue
        if src != "draft" and hosts is not None and g not in hosts.get(src, ()):
            continue
        if not (mean > 0) or not (n > 0) or mean == float("inf"):
            continue
        key = (edges[bucket_index(edges, b)], g, src)
        loss[key] = loss.get(key, 0.0) + mean * n
        cnt[key] = cnt.get(key, 0.0) + n
    entries = []
    for key in sorted(cnt):
        n = cnt[key]
        if n < cfg.min_fleet_count:
            continue
        pseudo = min(cfg.max_pseudo_count, max(cfg.min_pseudo_count, cfg.weight * n))
        if pseudo <= 0:
            continue
        entries.append(PriorEntry(bucket_lo=key[0], gamma=key[1], mean_loss_s=loss[key] / n, count=round(pseudo, 3),
                                  source=key[2]))
    return PlannerPriors(bucket_edges=edges, entries=entries, draft_prefill_s_per_token=draft_prefill_s_per_token)


def priors_equal(a: PlannerPriors | None, b: PlannerPriors | None, rel_tol: float = 0.02) -> bool:
    """True when pushing ``b`` over ``a`` would change nothing material (avoids rewriting the
    ConfigMap, and so reloading every worker, on every timer tick for noise-level changes)."""
    if a is None or b is None:
        return a is b
    if a.bucket_edges != b.bucket_edges or not _close(a.draft_prefill_s_per_token, b.draft_prefill_s_per_token, rel_tol):
        return False
    ea = {(e.bucket_lo, e.gamma, e.source): e for e in a.entries}
    eb = {(e.bucket_lo, e.gamma, e.source): e for e in b.entries}
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
