"""The reconcile: read spec and children, write only what differs, then status. All I/O lives here.

Level-based: every trigger (create/update/resume, the resync timer, an event on a child
Deployment) runs the same full comparison of desired vs live, so a missed event, a restart in the
middle, or someone editing a child all converge to the same state, and a second run writes
nothing. Children have fixed names derived from the owner, so a crashed run can never leave a
duplicate: the next run finds and adopts (or updates) what the previous one created.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import defaultdict
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from nightjar_operator import constants as c
from nightjar_operator.fleet.rollout import candidate_weight, stable_spec
from nightjar_operator.handlers.k8s import Api, api_error_reason, namespace_terminating
from nightjar_operator.handlers.settings import pod_policy
from nightjar_operator.metrics import metrics
from nightjar_operator.reconcile.autoscaling import KEDA_VERSION, desired_autoscaler
from nightjar_operator.reconcile.children import (
    NETWORK_POLICY_VERSION,
    Owner,
    desired_children,
    desired_network_policy,
    override_field,
)
from nightjar_operator.reconcile.config import live_priors
from nightjar_operator.reconcile.diff import Action, conflict_message, differences, plan, update_body
from nightjar_operator.reconcile.routing import (
    GATEWAY_VERSION,
    POOL_VERSION,
    desired_routing,
    possible_children,
    weighted,
)
from nightjar_operator.reconcile.status import (
    Condition,
    Observed,
    compute_status,
    get_condition,
    pod_problems,
    status_patch,
)
from nightjar_operator.reconcile.validate import validate

log = logging.getLogger("nightjar.operator")

ROUTING_VERSIONS = {"InferencePool": POOL_VERSION, "HTTPRoute": GATEWAY_VERSION, "Service": "v1"}

# Test-only fault injection: pause right after writing this child kind, so a test can SIGKILL the
# operator mid-reconcile at a known point. Never set in production manifests.
FAULT_PAUSE_AFTER = "NIGHTJAR_OPERATOR_FAULT_PAUSE_AFTER"
FAULT_PAUSE_SECONDS = "NIGHTJAR_OPERATOR_FAULT_PAUSE_SECONDS"

# One reconcile per object at a time (kopf runs sync handlers on a thread pool; the timer, the
# change handlers and child events may fire together).
_locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
_locks_guard = threading.Lock()


def _lock(uid: str) -> threading.Lock:
    with _locks_guard:
        return _locks[uid]


def _maybe_pause(kind: str) -> None:
    if os.environ.get(FAULT_PAUSE_AFTER) == kind:
        seconds = float(os.environ.get(FAULT_PAUSE_SECONDS, "60"))
        log.warning("fault injection: pausing %.0f s after writing the %s", seconds, kind)
        time.sleep(seconds)


def _summary(paths: list[str], limit: int = 4) -> str:
    short = sorted({p.replace("spec.template.spec.containers[0].", "container.") for p in paths})
    more = f" (+{len(short) - limit} more)" if len(short) > limit else ""
    return ", ".join(short[:limit]) + more


def rejection(e: ApiException, desired: dict[str, Any]) -> str | None:
    """A 422 (Invalid) from the apiserver as one line naming the spec fields behind it, or None."""
    if e.status != 422:
        return None
    try:
        body = json.loads(e.body or "{}")
    except ValueError:
        body = {}
    causes = (body.get("details") or {}).get("causes") or []
    pod = ((desired.get("spec") or {}).get("template") or {}).get("spec")
    parts = []
    for cause in causes:
        f = cause.get("field", "")
        if pod is not None and f.startswith("spec.template.spec."):
            f = override_field(f, pod)
        parts.append(f"{f}: {cause.get('message', '')}".strip(": "))
    what = "; ".join(parts) or body.get("message") or str(e.reason)
    return f"{desired['kind']} {desired['metadata']['name']} refused by the apiserver: {what}"


def _apply_child(api: Api, desired: dict[str, Any], live: dict[str, Any] | None, owner: Owner, body: dict[str, Any], observed: Observed) -> dict[str, Any] | None:
    kind, name = desired["kind"], desired["metadata"]["name"]
    action = plan(desired, live, owner.uid)
    m = metrics()
    if action is Action.NONE:
        return live
    if action is Action.CONFLICT:  # appeared since the reconcile looked (see conflicts())
        assert live is not None
        observed.conflicts.append(conflict_message(live))
        m.child_conflicts.labels(kind).inc()
        return None
    if action is Action.CREATE:
        try:
            created = api.create(desired)
        except ApiException as e:
            if e.status == 409:  # created concurrently (another trigger or a previous run): compare again
                raise kopf.TemporaryError(f"{kind} {name} appeared while creating it; retrying", delay=1) from e
            if namespace_terminating(e):  # e.g. a child's deletion event while the namespace goes away
                log.info("namespace %s is being deleted: not re-creating %s %s", owner.namespace, kind, name)
                return None
            if (why := rejection(e, desired)) is not None:
                observed.rejected.append(why)
                return None
            raise
        m.child_writes.labels(kind, "create").inc()
        api.post_event(body, "Normal", "Created", f"Created {kind} {name}")
        log.info("created %s %s/%s", kind, owner.namespace, name)
        _maybe_pause(kind)
        return created
    assert live is not None
    changed = differences(desired, live) or ["metadata.annotations"]
    try:
        updated = api.replace(update_body(desired, live))
    except ApiException as e:
        if e.status == 409:  # someone wrote in between (resourceVersion): re-read and compare again
            raise kopf.TemporaryError(f"{kind} {name} changed while updating it; retrying", delay=1) from e
        if (why := rejection(e, desired)) is not None:  # the running version stays as it is
            observed.rejected.append(why)
            return live
        raise
    m.child_writes.labels(kind, "update").inc()
    api.post_event(body, "Normal", "Updated", f"Updated {kind} {name}: {_summary(changed)}")
    log.info("updated %s %s/%s: %s", kind, owner.namespace, name, _summary(changed))
    _maybe_pause(kind)
    return updated


Key = tuple[str, str]  # (kind, name) of a child


def conflicts(wanted: list[dict[str, Any]], live: dict[Key, dict[str, Any] | None], owner: Owner) -> list[str]:
    """Children whose name is taken by an object that is not ours: the reconcile then writes
    nothing at all (a Deployment mounting someone else's ConfigMap, or pods behind someone else's
    Service, would be worse than no pool), and Degraded=Conflict names each object."""
    out = []
    for desired in wanted:
        obj = live.get((desired["kind"], desired["metadata"]["name"]))
        if obj is not None and plan(desired, obj, owner.uid) is Action.CONFLICT:
            out.append(conflict_message(obj))
            metrics().child_conflicts.labels(desired["kind"]).inc()
    return out


def _delete_unwanted(api: Api, live: dict[Key, dict[str, Any] | None], wanted: set[Key], owner: Owner) -> None:
    """Optional children (the PodDisruptionBudget, an autoscaler, routing) that the spec no longer
    asks for go away; only ours (controller ownerReference), never an object someone else made
    with the same name."""
    for (kind, name), obj in live.items():
        if (kind, name) in wanted or obj is None:
            continue
        if not any(r.get("uid") == owner.uid and r.get("controller") for r in obj["metadata"].get("ownerReferences") or []):
            continue
        try:
            api.request("DELETE", api.path(kind, owner.namespace, name))
        except ApiException as e:
            if e.status != 404:
                raise
        metrics().child_writes.labels(kind, "delete").inc()
        log.info("deleted %s %s/%s (no longer wanted)", kind, owner.namespace, name)
        live[(kind, name)] = None


def _live_optional(api: Api, namespace: str, children: list[tuple[str, str, str]]) -> tuple[dict[Key, dict[str, Any] | None], set[str]]:
    """Optional children, given as (kind, name, group/version), that the cluster can hold (a version
    it does not serve is left out), and the kinds the operator may not read (its RBAC left them
    out: chart values operator.autoscaling, operator.routing)."""
    out: dict[Key, dict[str, Any] | None] = {}
    forbidden: set[str] = set()
    for kind, name, version in children:
        if kind in forbidden or not api.served(version):
            continue
        try:
            out[(kind, name)] = api.get(kind, namespace, name)
        except ApiException as e:
            if e.status != 403:
                raise
            forbidden.add(kind)
    return out, forbidden


ENV_NETWORK_POLICY_PEERS = "NIGHTJAR_NETWORK_POLICY_PEERS"


def network_policy_peers() -> list[dict[str, Any]]:
    """NetworkPolicyPeers admitted to every worker pool that has spec.networkPolicy: the operator
    itself (its fleet loop scrapes /metrics) and Prometheus, as the chart renders them (JSON)."""
    return list(json.loads(os.environ.get(ENV_NETWORK_POLICY_PEERS) or "[]"))


def _forbidden(objs: list[dict[str, Any]], forbidden: set[str], field: str, values: str) -> Condition | None:
    kinds = sorted({o["kind"] for o in objs} & forbidden)
    if not kinds:
        return None
    return ("False", "Forbidden", f"{field}: the operator may not manage {', '.join(k + 's' for k in kinds)} "
            f"(chart values {values})")  # fmt: skip


def reconcile(api: Api, body: dict[str, Any], trigger: str) -> dict[str, Any] | None:
    """Bring the children in line with the spec and write the status. Returns the new status."""
    meta = body["metadata"]
    if meta.get("deletionTimestamp"):
        return None  # being deleted: the garbage collector removes the children; never recreate them
    owner = Owner.from_body(body)
    m = metrics()
    start = time.monotonic()
    result = "error"
    try:
        with _lock(owner.uid):
            spec, errors = validate(body.get("spec"), owner.name, pod_policy())
            cm_key, dep_key = ("ConfigMap", c.config_map_name(owner.name)), ("Deployment", c.deployment_name(owner.name))
            fixed = (cm_key, dep_key, ("Service", c.service_name(owner.name)), ("PodDisruptionBudget", c.pdb_name(owner.name)))
            live: dict[Key, dict[str, Any] | None] = {(k, n): api.get(k, owner.namespace, n) for k, n in fixed}
            conditions = (body.get("status") or {}).get("conditions")
            optional = [("HorizontalPodAutoscaler", owner.name, api.hpa_api_version()),
                        ("ScaledObject", owner.name, KEDA_VERSION), ("NetworkPolicy", owner.name, NETWORK_POLICY_VERSION)]
            had_routing = get_condition(conditions, c.COND_ROUTING) is not None
            if had_routing or (spec is not None and (spec.routing.http_route or spec.routing.inference_pool)):
                optional += [(k, n, ROUTING_VERSIONS[k]) for k, n in possible_children(owner.name)]
            found, forbidden = _live_optional(api, owner.namespace, optional)
            live.update(found)
            observed = Observed()
            if errors:
                observed.invalid = [str(e) for e in errors]
                m.invalid_specs.inc()
                result = "invalid"
            else:
                assert spec is not None
                # During a model-pair rollout the stable Deployment keeps the stable pair and share.
                split = weighted(spec, api.served)
                routes, observed.routing = desired_routing(owner, spec, api.served, candidate_weight(body.get("status")),
                                                           had_routing)  # fmt: skip
                if (refused := _forbidden(routes, forbidden, "spec.routing", "operator.routing")) is not None:
                    routes, observed.routing, split = [], refused, False
                spec = stable_spec(spec, body.get("status"), split)
                cm = live[cm_key]
                priors = live_priors(((cm or {}).get("data") or {}).get(c.CONFIG_KEY)) if cm else None
                wanted = desired_children(owner, spec, priors, api.pdb_api_version())
                had = get_condition(conditions, c.COND_AUTOSCALING) is not None
                scaler, observed.autoscaling = desired_autoscaler(owner, spec, api.served, had)
                scalers = [scaler] if scaler is not None else []
                if (refused := _forbidden(scalers, forbidden, "spec.autoscaling.engine", "operator.autoscaling")) is not None:
                    scalers, observed.autoscaling = [], refused
                policy = desired_network_policy(owner, spec, network_policy_peers())
                policies = [policy] if policy is not None else []
                if "NetworkPolicy" in forbidden and policies:
                    policies = []
                    observed.rejected.append("spec.networkPolicy: the operator may not manage NetworkPolicies (its RBAC)")
                wanted += scalers + routes + policies
                observed.conflicts = conflicts(wanted, live, owner)
                for desired in wanted if not observed.conflicts else []:
                    key = (desired["kind"], desired["metadata"]["name"])
                    live[key] = _apply_child(api, desired, live.get(key), owner, body, observed)
                if not observed.conflicts:
                    _delete_unwanted(api, live, {(d["kind"], d["metadata"]["name"]) for d in wanted}, owner)
                result = "conflict" if observed.conflicts else "ok"
            dep = live[dep_key]
            observed.deployment = dep if dep is not None and any(
                r.get("uid") == owner.uid for r in dep["metadata"].get("ownerReferences") or []
            ) else None
            if observed.deployment is not None:
                observed.pod_problems = pod_problems(api.worker_pods(owner.namespace, owner.name))
            return write_status(api, body, observed)
    except ApiException as e:
        m.reconcile_errors.labels(api_error_reason(e)).inc()
        raise
    except kopf.TemporaryError:
        m.reconcile_errors.labels("Conflict").inc()
        raise
    finally:
        m.reconciles.labels(trigger, result).inc()
        m.reconcile_seconds.observe(time.monotonic() - start)


def write_status(api: Api, body: dict[str, Any], observed: Observed) -> dict[str, Any] | None:
    """Compute the status against the freshest CR and patch it only if something changed."""
    meta = body["metadata"]
    m = metrics()
    for attempt in range(5):
        fresh = api.get(c.KIND, meta["namespace"], meta["name"])
        if fresh is None or fresh["metadata"]["uid"] != meta["uid"]:
            return None
        basis = {"metadata": body["metadata"], "spec": body.get("spec"), "status": fresh.get("status")}
        new = compute_status(basis, observed)
        old = fresh.get("status") or {}
        old_ready = get_condition(old.get("conditions"), c.COND_READY) or {}
        new_ready = get_condition(new["conditions"], c.COND_READY) or {}
        patch = status_patch(old, new)
        _publish(meta, new, int((body.get("spec") or {}).get("replicas") or 0))
        if patch is None:
            return new
        try:
            api.patch_status(meta["namespace"], meta["name"], patch, fresh["metadata"]["resourceVersion"])
        except ApiException as e:
            if e.status == 404:
                return None  # deleted meanwhile: nothing left to report on
            if e.status == 409 and attempt < 4:
                continue
            raise
        m.status_writes.inc()
        if new_ready.get("reason") == "InvalidSpec" and (
            old_ready.get("reason") != "InvalidSpec" or old_ready.get("message") != new_ready.get("message")
        ):
            api.post_event(body, "Warning", "InvalidSpec", new_ready.get("message", ""))
        elif new_ready.get("status") != old_ready.get("status") and new_ready.get("status") == "True":
            api.post_event(body, "Normal", "Ready", new_ready.get("message", ""))
        return new
    return None


def _publish(meta: dict[str, Any], status: dict[str, Any], desired_replicas: int) -> None:
    m = metrics()
    ready = get_condition(status.get("conditions"), c.COND_READY) or {}
    m.ready.labels(meta["namespace"], meta["name"]).set(1 if ready.get("status") == "True" else 0)
    m.replicas.labels(meta["namespace"], meta["name"], "ready").set(status.get("readyReplicas") or 0)
    m.replicas.labels(meta["namespace"], meta["name"], "desired").set(desired_replicas)


def on_child_event(api: Api, child: dict[str, Any], attempts: int = 5) -> None:
    """A child Deployment changed (status, scale, an edit): reconcile its owner.

    kopf never retries event handlers, and the last event of a rollout is the one that makes the
    owner Ready: a lost race (409 with another writer of the status) is retried here, re-reading
    the owner each time.
    """
    cmeta = child.get("metadata") or {}
    for ref in cmeta.get("ownerReferences") or []:
        if ref.get("kind") == c.KIND and ref.get("controller"):
            for attempt in range(attempts):
                owner = api.get(c.KIND, cmeta["namespace"], ref["name"])
                if owner is None or owner["metadata"]["uid"] != ref.get("uid"):
                    return
                try:
                    reconcile(api, owner, trigger="child")
                    return
                except kopf.TemporaryError:
                    pass
                except ApiException as e:
                    if e.status != 409:
                        raise
                time.sleep(0.2 * (attempt + 1))
            log.warning("child event for %s/%s: gave up after %d conflicts", cmeta["namespace"], ref["name"], attempts)
