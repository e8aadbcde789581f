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
from nightjar_operator.fleet.rollout import stable_spec
from nightjar_operator.handlers.k8s import Api, api_error_reason, namespace_terminating
from nightjar_operator.metrics import metrics
from nightjar_operator.reconcile.autoscaling import KEDA_VERSION, desired_autoscaler
from nightjar_operator.reconcile.children import Owner, desired_children, override_field
from nightjar_operator.reconcile.config import live_priors
from nightjar_operator.reconcile.diff import Action, differences, plan, update_body
from nightjar_operator.reconcile.status import (
    Observed,
    compute_status,
    get_condition,
    pod_problems,
    status_patch,
)
from nightjar_operator.reconcile.validate import parse_spec, semantic_errors

log = logging.getLogger("nightjar.operator")

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
    if action is Action.CONFLICT:
        observed.conflicts.append(f"{kind} {name} exists and is controlled by another owner")
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


def _delete_unwanted(api: Api, live: dict[str, Any], wanted: set[str], owner: Owner) -> None:
    """Optional children (the PodDisruptionBudget) that the spec no longer asks for go away; only
    ours (controller ownerReference), never an object someone else made with the same name."""
    for kind, obj in live.items():
        if kind in wanted or obj is None:
            continue
        if not any(r.get("uid") == owner.uid and r.get("controller") for r in obj["metadata"].get("ownerReferences") or []):
            continue
        try:
            api.request("DELETE", api.path(kind, owner.namespace, obj["metadata"]["name"]))
        except ApiException as e:
            if e.status != 404:
                raise
        metrics().child_writes.labels(kind, "delete").inc()
        log.info("deleted %s %s/%s (no longer wanted)", kind, owner.namespace, obj["metadata"]["name"])
        live[kind] = None


def _live_autoscalers(api: Api, owner: Owner) -> tuple[dict[str, dict[str, Any] | None], set[str]]:
    """The autoscaler children the cluster can hold (a kind it does not serve is left out), and the
    kinds the operator may not read (its RBAC left them out: chart values operator.autoscaling)."""
    out: dict[str, dict[str, Any] | None] = {}
    forbidden: set[str] = set()
    for kind, served in (("HorizontalPodAutoscaler", api.served(api.hpa_api_version())),
                         ("ScaledObject", api.served(KEDA_VERSION))):
        if not served:
            continue
        try:
            out[kind] = api.get(kind, owner.namespace, owner.name)
        except ApiException as e:
            if e.status != 403:
                raise
            forbidden.add(kind)
    return out, forbidden


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
            spec, errors = parse_spec(body.get("spec"))
            if spec is not None:
                errors = semantic_errors(spec, owner.name)
            live = {
                "ConfigMap": api.get("ConfigMap", owner.namespace, c.config_map_name(owner.name)),
                "Deployment": api.get("Deployment", owner.namespace, c.deployment_name(owner.name)),
                "Service": api.get("Service", owner.namespace, c.service_name(owner.name)),
                "PodDisruptionBudget": api.get("PodDisruptionBudget", owner.namespace, c.pdb_name(owner.name)),
            }
            scalers, forbidden = _live_autoscalers(api, owner)
            live.update(scalers)
            observed = Observed()
            if errors:
                observed.invalid = [str(e) for e in errors]
                m.invalid_specs.inc()
                result = "invalid"
            else:
                assert spec is not None
                # During a model-pair rollout the stable Deployment keeps the stable pair and share.
                spec = stable_spec(spec, body.get("status"))
                cm = live["ConfigMap"]
                priors = live_priors(((cm or {}).get("data") or {}).get(c.CONFIG_KEY)) if cm else None
                wanted = desired_children(owner, spec, priors, api.pdb_api_version())
                had = get_condition((body.get("status") or {}).get("conditions"), c.COND_AUTOSCALING) is not None
                scaler, observed.autoscaling = desired_autoscaler(owner, spec, api.served, had)
                if scaler is not None and scaler["kind"] in forbidden:
                    observed.autoscaling = ("False", "Forbidden", f"spec.autoscaling.engine: the operator may not manage "
                                            f"{scaler['kind']}s (chart values operator.autoscaling)")  # fmt: skip
                    scaler = None
                wanted += [scaler] if scaler is not None else []
                for desired in wanted:
                    kind = desired["kind"]
                    live[kind] = _apply_child(api, desired, live[kind], owner, body, observed)
                _delete_unwanted(api, live, {d["kind"] for d in wanted}, owner)
                result = "conflict" if observed.conflicts else "ok"
            dep = live["Deployment"]
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
