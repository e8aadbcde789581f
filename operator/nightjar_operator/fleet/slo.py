"""SLO evaluation (pure): fleet latency histograms -> attainment and the ``SLOMet`` condition.

Attainment of one target is the fraction of requests of the window whose latency is within it,
read off the histogram with the same linear interpolation PromQL's ``histogram_quantile`` uses.
With TTFT and TPOT targets both set, the attainment reported is the smaller of the two (the joint
fraction cannot be recovered from two marginal histograms; the minimum is its tightest upper bound).
The SLO is met when every configured target's attainment reaches the objective (0.95 for p95
targets: then "attainment >= 0.95" and "measured p95 <= target" say the same thing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nightjar_operator.fleet.aggregate import FleetStats

CONDITION_TYPE = "SLOMet"


@dataclass(frozen=True)
class ConditionVerdict:
    """What a pure evaluation decides for one status condition."""

    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str


@dataclass(frozen=True)
class SloEvaluation(ConditionVerdict):
    attainment: float | None
    ttft_p95_s: float | None
    tpot_p95_s: float | None
    requests: float

    @property
    def met(self) -> bool:
        return self.status == "True"


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 1000:.1f}ms"


def evaluate_slo(
    stats: FleetStats,
    ttft_p95_ms: int | None,
    tpot_p95_ms: int | None,
    objective: float = 0.95,
    min_requests: float = 1.0,
) -> SloEvaluation:
    """Evaluate the SLO over the window ``stats`` covers (see the module docstring)."""
    if not 0 < objective <= 1:
        raise ValueError(f"objective: must lie in (0, 1] (got {objective})")
    ttft_p95 = stats.ttft.quantile(0.95) if stats.ttft is not None else None
    tpot_p95 = stats.tpot.quantile(0.95) if stats.tpot is not None else None
    parts = [f"ttft p95={_ms(ttft_p95)}", f"tpot p95={_ms(tpot_p95)}"]
    if ttft_p95_ms is None and tpot_p95_ms is None:
        return SloEvaluation("Unknown", "NoTargets", "no SLO targets in spec.slo; " + ", ".join(parts), None, ttft_p95, tpot_p95, stats.requests)
    fracs: list[float] = []
    detail: list[str] = []
    n_req = 0.0
    for label, hist, target_ms, p95 in (
        ("ttft", stats.ttft, ttft_p95_ms, ttft_p95),
        ("tpot", stats.tpot, tpot_p95_ms, tpot_p95),
    ):
        if target_ms is None:
            continue
        n = hist.observations if hist is not None else 0.0
        n_req = max(n_req, n)
        if hist is None or n < min_requests:
            detail.append(f"{label}: no requests in window (target {target_ms}ms)")
            continue
        f = hist.fraction_le(target_ms / 1000.0)
        assert f is not None
        fracs.append(f)
        detail.append(f"{label} p95={_ms(p95)} (target {target_ms}ms, within {f:.3f})")
    n_targets = (ttft_p95_ms is not None) + (tpot_p95_ms is not None)
    if len(fracs) < n_targets:
        return SloEvaluation(
            "Unknown", "NoTraffic", "; ".join(detail) + f"; pods={stats.pods}", None, ttft_p95, tpot_p95, n_req
        )
    att = min(fracs)
    met = att >= objective
    msg = "; ".join(detail) + f"; attainment={att:.3f} (objective {objective:.3f}) over {n_req:.0f} requests, pods={stats.pods}"
    return SloEvaluation(
        "True" if met else "False", "TargetsMet" if met else "TargetsMissed", msg, att, ttft_p95, tpot_p95, n_req
    )


def condition(ev: SloEvaluation, generation: int | None, now_iso: str, previous: dict | None = None) -> dict:
    """The ``SLOMet`` status condition (Kubernetes conventions). ``lastTransitionTime`` only moves
    when the status changes."""
    ltt = now_iso
    if previous and previous.get("status") == ev.status and previous.get("lastTransitionTime"):
        ltt = previous["lastTransitionTime"]
    cond = {
        "type": CONDITION_TYPE,
        "status": ev.status,
        "reason": ev.reason,
        "message": ev.message,
        "lastTransitionTime": ltt,
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond
