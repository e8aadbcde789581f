"""Rollout of a new draft/target model pair (pure state machine).

A change of the model pair in the spec does not roll every worker at once: a *candidate* revision
(its own Deployment and ConfigMap) takes a growing share of the traffic per ``spec.rollout.steps``
(percent of replicas behind the one Service). Each step lasts one analysis window; at its end the
candidate's SLO attainment and per-pod throughput are compared with the stable revision's over the
same window, and the rollout advances, promotes the candidate (after the last step) or rolls it
back. Every decision carries a reason (status + event).

The whole state lives in ``status.rollout`` (a plain dict, see ``RolloutState``), so an operator
restarted mid-rollout resumes at the same step; only the interrupted analysis window restarts
(its baselines were in memory): the handler calls ``restart_window``.

Step contract: the handler calls ``plan(state, desired, ...)`` once per tick with the measured
``Analysis`` of the current window (or None), applies ``Plan.replicas`` to the two Deployments,
persists ``Plan.state`` and emits ``Plan.events``.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nightjar_operator.crd.models import ModelRef, NightjarDeploymentSpec

Phase = Literal["Stable", "Progressing", "RolledBack"]


def revision_of(pair: dict[str, Any]) -> str:
    """Stable short id of a model pair (target + draft specs): same pair -> same revision."""
    blob = json.dumps(pair, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


class Revision(BaseModel):
    model_config = ConfigDict(extra="ignore")

    revision: str
    pair: dict[str, Any] = Field(default_factory=dict, description="target/draft spec of this revision")
    label: str = Field("", description="human summary, e.g. 'target-name/draft-name'")


class Decision(BaseModel):
    model_config = ConfigDict(extra="ignore")

    action: Literal["Started", "Advanced", "Promoted", "RolledBack", "Aborted", "Waiting", "Adopted"]
    reason: str
    at: float


class RolloutState(BaseModel):
    """Persisted in ``status.rollout`` (camelCase keys via ``to_status``)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    phase: Phase = "Stable"
    stable: Revision | None = None
    candidate: Revision | None = None
    step: int = Field(0, description="index into spec.rollout.steps of the current step")
    weight: int = Field(0, description="candidate traffic share (percent) of the current step")
    window_started_at: float | None = Field(None, alias="windowStartedAt")
    failed_revision: str | None = Field(None, alias="failedRevision")
    last_decision: Decision | None = Field(None, alias="lastDecision")

    @classmethod
    def from_status(cls, d: dict | None) -> RolloutState | None:
        return cls.model_validate(d) if d else None

    def to_status(self) -> dict:
        """camelCase, without null fields (``merge_patch`` turns removals into nulls)."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)


@dataclass(frozen=True)
class Gate:
    """How a window's analysis is judged."""

    objective: float | None = None  # SLO attainment objective (None: no SLO configured)
    attainment_tolerance: float = 0.02  # candidate may trail stable by this much when stable misses too
    throughput_tolerance: float = 0.10  # candidate per-pod throughput may trail stable's by this fraction
    min_requests: float = 5.0  # fewer candidate requests in a window -> no decision yet


@dataclass(frozen=True)
class Analysis:
    """Measurements of one analysis window (from the fleet aggregation, per revision)."""

    candidate_attainment: float | None
    stable_attainment: float | None
    candidate_throughput_per_pod: float | None
    stable_throughput_per_pod: float | None
    candidate_requests: float
    stable_requests: float = 0.0
    # Throughput per pod says something about a revision only when its pods are saturated (requests
    # waiting); below saturation it is just the offered load, the same for both behind one Service.
    candidate_saturated: bool = False
    stable_saturated: bool = False


@dataclass
class Plan:
    state: RolloutState
    stable_replicas: int
    candidate_replicas: int
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type Normal|Warning, reason, message)


def split_replicas(total: int, weight: int, weighted: bool = False) -> tuple[int, int]:
    """(stable, candidate) replicas for a candidate share of ``weight`` percent of ``total``.

    Replica split (the one Service spreads requests over every pod): each revision keeps at least
    one replica until the candidate reaches 100% (so small deployments can still compare the two;
    the total may then exceed ``total`` by one). ``weighted``: an HTTPRoute's backend weights carry
    the share, so the stable revision keeps all its replicas (a rollback is instant) and the
    candidate gets enough for its share."""
    if weight <= 0:
        return total, 0
    if weighted:
        return total, max(1, math.ceil(total * min(weight, 100) / 100)) if total > 0 else 0
    if weight >= 100:
        return 0, total
    if total <= 0:
        return 0, 0
    cand = max(1, round(total * weight / 100))
    stable = max(1, total - cand)
    return stable, cand


def judge(a: Analysis, gate: Gate) -> tuple[bool | None, str]:
    """(True: candidate passes, False: fails, None: not enough data) and a reason."""
    if a.candidate_requests < gate.min_requests:
        return None, f"waiting for traffic: {a.candidate_requests:.0f} candidate requests < {gate.min_requests:.0f}"
    reasons: list[str] = []
    ok = True
    if gate.objective is not None and a.candidate_attainment is not None:
        floor = gate.objective
        if a.stable_attainment is not None and a.stable_requests >= gate.min_requests:
            # If the stable revision misses the objective too, do not blame the candidate for the load.
            floor = min(gate.objective, a.stable_attainment - gate.attainment_tolerance)
        stable_s = "n/a" if a.stable_attainment is None else f"{a.stable_attainment:.3f}"
        if a.candidate_attainment < floor:
            ok = False
            reasons.append(
                f"candidate SLO attainment {a.candidate_attainment:.3f} < {floor:.3f} "
                f"(objective {gate.objective:.3f}, stable {stable_s})"
            )
        else:
            reasons.append(f"candidate SLO attainment {a.candidate_attainment:.3f} (stable {stable_s})")
    ct, st = a.candidate_throughput_per_pod, a.stable_throughput_per_pod
    if not (a.candidate_saturated and a.stable_saturated):
        pass  # throughput is the offered load here: not compared
    elif ct is not None and st is not None and st > 0 and a.stable_requests >= gate.min_requests:
        ratio = ct / st
        if ratio < 1 - gate.throughput_tolerance:
            ok = False
            reasons.append(f"candidate throughput/pod {ct:.1f} tok/s is {ratio:.2f}x stable's {st:.1f}")
        else:
            reasons.append(f"throughput/pod {ratio:.2f}x stable")
    return ok, "; ".join(reasons) or "no SLO or throughput signal to compare; passing"


def restart_window(state: RolloutState, now: float) -> RolloutState:
    """Start the current step's analysis window again (its in-memory baselines were lost)."""
    if state.phase != "Progressing":
        return state
    return state.model_copy(update={"window_started_at": now})


def plan(
    state: RolloutState | None,
    desired: Revision,
    replicas: int,
    steps: list[int] | None,
    window_s: float,
    now: float,
    analysis: Analysis | None,
    gate: Gate | None = None,
    weighted: bool = False,
) -> Plan:
    """One tick of the rollout state machine (see module docstring). ``weighted``: the share goes
    through HTTPRoute weights (``split_replicas``)."""
    gate = gate or Gate()
    ev: list[tuple[str, str, str]] = []
    if state is None or state.stable is None:
        # First sight of this deployment (or status lost): adopt the desired pair as stable.
        s = RolloutState(stable=desired, last_decision=Decision(action="Adopted", reason="initial model pair", at=now))
        return Plan(s, replicas, 0, ev)
    s = state.model_copy(deep=True)
    if desired.revision == s.stable.revision:
        if s.candidate is not None:
            ev.append(("Normal", "RolloutAborted", f"model pair reverted to stable {s.stable.revision}; candidate {s.candidate.revision} removed"))
            s.last_decision = Decision(action="Aborted", reason="spec reverted to the stable model pair", at=now)
        s.stable = desired  # labels may have been refreshed
        s.candidate, s.phase, s.step, s.weight, s.window_started_at = None, "Stable", 0, 0, None
        s.failed_revision = None
        return Plan(s, replicas, 0, ev)
    if desired.revision == s.failed_revision:
        s.phase, s.candidate, s.weight = "RolledBack", None, 0
        return Plan(s, replicas, 0, ev)
    if not steps:
        # No staged rollout configured: the new pair replaces the old one directly.
        ev.append(("Normal", "ModelPairUpdated", f"{s.stable.revision} -> {desired.revision} (strategy Replace)"))
        s.stable, s.candidate, s.phase, s.step, s.weight = desired, None, "Stable", 0, 0
        s.window_started_at = None
        s.last_decision = Decision(action="Promoted", reason="replaced directly (spec.rollout.strategy Replace)", at=now)
        return Plan(s, replicas, 0, ev)
    if s.candidate is None or s.candidate.revision != desired.revision:
        if s.candidate is not None:
            ev.append(("Normal", "RolloutSuperseded", f"candidate {s.candidate.revision} replaced by {desired.revision}"))
        s.candidate, s.phase, s.step, s.weight = desired, "Progressing", 0, steps[0]
        s.window_started_at, s.failed_revision = now, None
        reason = f"model pair changed: stable {s.stable.revision} -> candidate {desired.revision} at {steps[0]}%"
        s.last_decision = Decision(action="Started", reason=reason, at=now)
        ev.append(("Normal", "RolloutStarted", reason))
        st, ca = split_replicas(replicas, s.weight, weighted)
        return Plan(s, st, ca, ev)
    # A candidate is in flight.
    s.step = min(s.step, len(steps) - 1)  # steps may have been edited shorter
    s.weight = steps[s.step]
    started = s.window_started_at if s.window_started_at is not None else now
    s.window_started_at = started
    if now - started < window_s or analysis is None:
        st, ca = split_replicas(replicas, s.weight, weighted)
        return Plan(s, st, ca, ev)
    verdict, why = judge(analysis, gate)
    if verdict is None:
        if s.last_decision is None or s.last_decision.action != "Waiting":
            s.last_decision = Decision(action="Waiting", reason=why, at=now)
        st, ca = split_replicas(replicas, s.weight, weighted)
        return Plan(s, st, ca, ev)
    if not verdict:
        reason = f"step {s.step + 1}/{len(steps)} at {s.weight}%: {why}"
        ev.append(("Warning", "RolloutRolledBack", f"candidate {s.candidate.revision} rolled back: {reason}"))
        s.failed_revision = s.candidate.revision
        s.candidate, s.phase, s.step, s.weight, s.window_started_at = None, "RolledBack", 0, 0, None
        s.last_decision = Decision(action="RolledBack", reason=reason, at=now)
        return Plan(s, replicas, 0, ev)
    if s.step + 1 >= len(steps):
        reason = f"passed {len(steps)} step(s): {why}"
        ev.append(("Normal", "RolloutPromoted", f"candidate {s.candidate.revision} promoted: {reason}"))
        s.stable, s.candidate, s.phase, s.step, s.weight, s.window_started_at = s.candidate, None, "Stable", 0, 0, None
        s.last_decision = Decision(action="Promoted", reason=reason, at=now)
        return Plan(s, replicas, 0, ev)
    s.step += 1
    s.weight = steps[s.step]
    s.window_started_at = now
    reason = f"step {s.step}/{len(steps)} passed ({why}); now {s.weight}%"
    s.last_decision = Decision(action="Advanced", reason=reason, at=now)
    ev.append(("Normal", "RolloutAdvanced", reason))
    st, ca = split_replicas(replicas, s.weight, weighted)
    return Plan(s, st, ca, ev)


def per_pod(total: float | None, pods: int) -> float | None:
    if total is None or pods <= 0 or math.isnan(total):
        return None
    return total / pods


def merge_patch(old: Any, new: Any) -> Any:
    """RFC 7386 merge patch turning ``old`` into ``new`` (None when nothing changes): keys missing
    from ``new`` become null (deleted), nested objects are diffed, lists/scalars are replaced."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return None if old == new else new
    out: dict[str, Any] = {}
    for k in old.keys() - new.keys():
        out[k] = None
    for k, v in new.items():
        if k not in old:
            out[k] = v
        elif isinstance(v, dict) and isinstance(old[k], dict):
            sub = merge_patch(old[k], v)
            if sub is not None:
                out[k] = sub
        elif old[k] != v:
            out[k] = v
    return out or None


# -------------------------------------------------------------------- the spec each Deployment renders
def pair_of(spec: NightjarDeploymentSpec) -> dict[str, Any]:
    return {"target": spec.target.wire(), "draft": spec.draft.wire()}


def stable_spec(spec: NightjarDeploymentSpec, status: dict[str, Any] | None,
                weighted: bool = False) -> NightjarDeploymentSpec:
    """The spec the *stable* Deployment is rendered from: while the spec's model pair differs from the
    stable revision in ``status.rollout``, keep the stable pair; during a rollout, keep the stable
    share of the replicas (all of them when ``weighted``). Without rollout state this is ``spec``."""
    if spec.rollout.strategy == "Replace":
        return spec  # no candidate revision: the new pair rolls out in the one Deployment
    try:
        st = RolloutState.from_status((status or {}).get("rollout"))
    except Exception:  # noqa: BLE001 - an unreadable state must not block the reconcile
        return spec
    if st is None or st.stable is None:
        return spec
    update: dict[str, Any] = {}
    if st.stable.revision != revision_of(pair_of(spec)) and st.stable.pair.get("target") and st.stable.pair.get("draft"):
        update["target"] = ModelRef.model_validate(st.stable.pair["target"])
        update["draft"] = ModelRef.model_validate(st.stable.pair["draft"])
    if st.phase == "Progressing" and st.candidate is not None:
        update["replicas"] = split_replicas(spec.replicas, st.weight, weighted)[0]
    return spec.model_copy(update=update) if update else spec


def candidate_weight(status: dict[str, Any] | None) -> int:
    """The candidate's traffic share in percent during a rollout (0 without one)."""
    try:
        st = RolloutState.from_status((status or {}).get("rollout"))
    except Exception:  # noqa: BLE001 - as in stable_spec
        return 0
    return st.weight if st is not None and st.phase == "Progressing" and st.candidate is not None else 0
