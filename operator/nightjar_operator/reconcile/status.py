"""Status and conditions of a NightjarDeployment, computed from what the cluster shows. Pure.

Conventions (metav1.Condition): ``lastTransitionTime`` moves only when ``status`` flips, every
condition carries the ``observedGeneration`` it was computed for. This module owns Ready,
Progressing and Degraded; it initialises SLOMet (Unknown) but never overwrites it: the fleet loop
measures the SLO. Conditions of other types written by others are kept as they are.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from nightjar_operator import constants as c
from nightjar_operator.reconcile.children import selector_string, service_selector, spec_field_of


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def get_condition(conditions: list[dict[str, Any]] | None, ctype: str) -> dict[str, Any] | None:
    return next((cond for cond in conditions or [] if cond.get("type") == ctype), None)


def set_condition(
    conditions: list[dict[str, Any]],
    ctype: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
    now: str,
) -> list[dict[str, Any]]:
    """Return a new list with ``ctype`` set; its transition time is kept unless ``status`` changes."""
    old = get_condition(conditions, ctype)
    # Never an empty message: the 1.20 apiserver built here decodes "" in a status patch as null and
    # rejects it against the string schema.
    message = message or reason
    new = {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == status else now,
    }
    if generation is not None:
        new["observedGeneration"] = generation
    out = [dict(cond) for cond in conditions]
    for i, cond in enumerate(out):
        if cond.get("type") == ctype:
            out[i] = new
            return out
    return out + [new]


Condition = tuple[str, str, str]  # (status, reason, message) of a condition the reconcile decides


@dataclass
class Observed:
    """What a reconcile saw and decided."""

    deployment: dict[str, Any] | None = None  # live Deployment (with .status)
    invalid: list[str] = field(default_factory=list)  # InvalidSpec messages, each naming a field
    conflicts: list[str] = field(default_factory=list)  # children with our name owned by someone else
    pod_problems: list[str] = field(default_factory=list)  # why worker pods do not start (pod_problems())
    rejected: list[str] = field(default_factory=list)  # children the apiserver refused (422), naming spec fields
    autoscaling: Condition | None = None  # the Autoscaling condition
    routing: Condition | None = None  # the Routing condition


# Waiting reasons that do not clear by themselves: the pod needs a fix (image, config, crash).
_STUCK_REASONS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "CrashLoopBackOff",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
})
_MESSAGE_CHARS = 400


def pod_problems(pods: list[dict[str, Any]]) -> list[str]:
    """One line per worker pod that cannot start or keeps failing, naming the pod, the container and
    the cause (the kubelet's reason, the exit code and the container's termination message)."""
    out: list[str] = []
    for pod in pods:
        meta, st = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            continue
        name = meta.get("name", "?")
        sched = get_condition(st.get("conditions"), "PodScheduled")
        if sched and sched.get("status") == "False" and sched.get("reason") == "Unschedulable":
            out.append(f"pod {name}: unschedulable: {sched.get('message', '')}"[:_MESSAGE_CHARS])
            continue
        for kind, key in (("init container", "initContainerStatuses"), ("container", "containerStatuses")):
            for cs in st.get(key) or []:
                state = cs.get("state") or {}
                waiting = state.get("waiting") or {}
                term = state.get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
                failed_now = bool(state.get("terminated")) and term.get("exitCode", 0) != 0
                if waiting.get("reason") not in _STUCK_REASONS and not failed_now:
                    continue
                reason = waiting.get("reason") or term.get("reason") or "Error"
                code = term.get("exitCode", 0)
                if code != 0:  # the last run's end says most: exit code, OOMKilled, termination message
                    why = term.get("reason") if term.get("reason") not in (None, "Error", reason) else None
                    msg = (term.get("message") or "").strip()
                    detail = f"exit code {code}" + (f" {why}" if why else "") + (f": {msg}" if msg else "")
                else:
                    detail = (waiting.get("message") or "").strip()
                env = next((ct.get("env") for ct in (pod.get("spec") or {}).get("containers") or []
                            if ct.get("name") == cs.get("name")), None)
                field = spec_field_of(cs.get("name", ""), waiting.get("message") or "", env)
                where = f"{kind} {cs.get('name', '?')}" + (f" ({field})" if field else "")
                line = f"pod {name} {where}: {reason}" + (f" ({detail})" if detail else "")
                out.append(" ".join(line.split())[:_MESSAGE_CHARS])
    return out


def _deployment_condition(dep: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return get_condition((dep.get("status") or {}).get("conditions"), ctype)


def compute_status(body: dict[str, Any], observed: Observed, now: str | None = None) -> dict[str, Any]:
    """The full new ``status`` (other writers' fields are carried over)."""
    now = now or now_iso()
    meta = body["metadata"]
    gen = meta.get("generation")
    spec = body.get("spec") or {}
    old = dict(body.get("status") or {})
    want = int(spec.get("replicas", 1) or 0)
    conds = [dict(x) for x in old.get("conditions") or []]

    dep = observed.deployment
    ds = (dep or {}).get("status") or {}
    replicas = int(ds.get("replicas") or 0)
    ready = int(ds.get("readyReplicas") or 0)
    updated = int(ds.get("updatedReplicas") or 0)
    dep_want = int(((dep or {}).get("spec") or {}).get("replicas") or 0)
    synced = dep is not None and int(ds.get("observedGeneration") or 0) >= int(dep["metadata"].get("generation") or 0)
    done = synced and replicas == dep_want and updated == dep_want and ready == dep_want

    # Degraded: what the Deployment controller reports as stuck, or a name clash.
    degraded = ("False", "AsExpected", "no failure reported")
    if observed.conflicts:
        degraded = ("True", "Conflict", "; ".join(observed.conflicts))
    elif observed.rejected:
        degraded = ("True", "ChildRejected", "; ".join(observed.rejected))
    elif observed.pod_problems:
        more = len(observed.pod_problems) - 3
        degraded = ("True", "PodFailing", "; ".join(observed.pod_problems[:3]) + (f" (+{more} more)" if more > 0 else ""))
    elif dep is not None:
        prog = _deployment_condition(dep, "Progressing")
        fail = _deployment_condition(dep, "ReplicaFailure")
        if prog and prog.get("status") == "False" and prog.get("reason") == "ProgressDeadlineExceeded":
            degraded = ("True", "ProgressDeadlineExceeded", prog.get("message") or "progress deadline exceeded")
        elif fail and fail.get("status") == "True":
            degraded = ("True", "ReplicaFailure", fail.get("message") or "replica failure")

    if observed.invalid:
        msg = "; ".join(observed.invalid)
        ready_c = ("False", "InvalidSpec", msg)
        prog_c = ("False", "InvalidSpec", "spec rejected; running children left unchanged")
    elif observed.conflicts:
        ready_c = ("False", "Conflict", "; ".join(observed.conflicts))
        prog_c = ("False", "Conflict", "a child's name is taken by an object the operator did not create")
    elif observed.rejected:
        ready_c = ("False", "ChildRejected", "; ".join(observed.rejected))
        prog_c = ("False", "ChildRejected", "the apiserver refused a child; running children left unchanged")
    elif dep is None:
        ready_c = ("False", "Creating", "worker Deployment not created yet")
        prog_c = ("True", "Creating", "creating children")
    elif done and dep_want == want:
        if want == 0:
            ready_c = ("True", "ScaledToZero", "0 replicas requested")
        else:
            ready_c = ("True", "AllReplicasReady", f"{ready}/{want} replicas ready")
        prog_c = ("False", "RolloutComplete", f"{ready}/{want} replicas ready and up to date")
    else:
        detail = f"{updated}/{dep_want} updated, {ready}/{dep_want} ready"
        if not synced or updated < dep_want:
            reason = "RollingOut"
        elif ready < dep_want or replicas < dep_want:
            reason = "ScalingUp"
        else:
            reason = "ScalingDown"
        ready_c = ("False", reason, detail)
        prog_c = ("True", reason, detail)

    conds = set_condition(conds, c.COND_READY, *ready_c, gen, now)
    conds = set_condition(conds, c.COND_PROGRESSING, *prog_c, gen, now)
    conds = set_condition(conds, c.COND_DEGRADED, *degraded, gen, now)
    if get_condition(conds, c.COND_SLO_MET) is None:
        conds = set_condition(conds, c.COND_SLO_MET, "Unknown", "NotMeasured", "no SLO measurements yet", gen, now)
    if get_condition(conds, c.COND_ELASTIC_MEMORY) is None:  # the fleet loop sets it from the workers' metrics
        conds = set_condition(conds, c.COND_ELASTIC_MEMORY, "Unknown", "NotMeasured",
                              "no worker has reported its elastic memory state yet", gen, now)
    if observed.autoscaling is not None:
        conds = set_condition(conds, c.COND_AUTOSCALING, *observed.autoscaling, gen, now)
    if observed.routing is not None:
        conds = set_condition(conds, c.COND_ROUTING, *observed.routing, gen, now)
    conds.sort(key=lambda x: (c.CONDITION_TYPES + (x["type"],)).index(x["type"]))

    status = dict(old)
    status.update(
        {
            "observedGeneration": gen,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "selector": selector_string(service_selector(meta["name"])),
            "conditions": conds,
        }
    )
    ann = ((dep or {}).get("metadata") or {}).get("annotations") or {}
    if dep is not None:
        status["target"] = ann.get(c.ANN_TARGET)
        status["draft"] = ann.get(c.ANN_DRAFT)
    return {k: v for k, v in status.items() if v is not None}


def status_patch(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any] | None:
    """Merge patch turning ``old`` into ``new`` for our keys, or None when nothing changed."""
    old = old or {}
    diff = {k: v for k, v in new.items() if old.get(k) != v}
    return diff or None
