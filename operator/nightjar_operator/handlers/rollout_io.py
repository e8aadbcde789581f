"""Rollout I/O: the candidate revision's children, the state in ``status.rollout``, events.

Called by the fleet timer once per tick (``handlers.fleet_tick.tick``) with the pods' current scrapes. The
decisions come from the pure state machine ``fleet.rollout.plan``; here we

- measure the current analysis window per track (baselines kept in the fleet memo; lost baselines
  after an operator restart restart the window: ``restart_window``),
- persist the new state in ``status.rollout`` (read-modify-write with resourceVersion),
- create/scale/delete the candidate Deployment ``<name>-candidate`` and ConfigMap
  ``<name>-candidate-config`` (built with the reconcile's own builders, on the track ``candidate``
  behind the one Service),
- and let the main reconcile re-render the stable Deployment: it calls ``stable_spec`` to keep the
  stable model pair and the stable share of the replicas while a rollout is in flight.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from nightjar_operator import constants as c
from nightjar_operator.crd.models import NightjarDeploymentSpec
from nightjar_operator.fleet.aggregate import PodMetrics, aggregate, window
from nightjar_operator.fleet.rollout import (
    Analysis,
    Gate,
    Plan,
    Revision,
    RolloutState,
    merge_patch,
    pair_of,
    per_pod,
    plan,
    restart_window,
    revision_of,
)
from nightjar_operator.fleet.slo import evaluate_slo
from nightjar_operator.handlers.k8s import Api
from nightjar_operator.metrics import op_metrics
from nightjar_operator.reconcile.children import (
    Owner,
    desired_config_map,
    desired_deployment,
    pod_selector,
    stable_hash,
)
from nightjar_operator.reconcile.config import live_priors, render_runtime_config
from nightjar_operator.reconcile.diff import Action, update_body
from nightjar_operator.reconcile.diff import plan as diff_plan
from nightjar_operator.reconcile.routing import weighted

log = logging.getLogger("nightjar.operator.rollout")

# --------------------------------------------------------------------------------- pure helpers


def desired_revision(spec: NightjarDeploymentSpec) -> Revision:
    pair = pair_of(spec)
    return Revision(revision=revision_of(pair), pair=pair, label=f"{spec.target.name}/{spec.draft.name}")


def _retrack(obj: dict[str, Any], name: str) -> dict[str, Any]:
    """Turn a stable child (from the reconcile's builders, without priors) into the candidate's."""
    obj = copy.deepcopy(obj)
    ann = obj["metadata"].setdefault("annotations", {})
    ann.pop(c.ANN_DESIRED_HASH, None)
    obj["metadata"]["labels"][c.LABEL_TRACK] = c.TRACK_CANDIDATE
    if obj["kind"] == "ConfigMap":
        obj["metadata"]["name"] = c.candidate_config_name(name)
    else:
        obj["metadata"]["name"] = c.candidate_name(name)
        spec = obj["spec"]
        spec["selector"] = {"matchLabels": pod_selector(name, c.TRACK_CANDIDATE)}
        spec["template"]["metadata"]["labels"][c.LABEL_TRACK] = c.TRACK_CANDIDATE
        for v in spec["template"]["spec"]["volumes"]:
            if "configMap" in v and v["configMap"].get("name") == c.config_map_name(name):
                v["configMap"]["name"] = c.candidate_config_name(name)
    ann[c.ANN_DESIRED_HASH] = stable_hash(obj)
    return obj


def candidate_children(owner: Owner, spec: NightjarDeploymentSpec, replicas: int, priors: Any) -> list[dict[str, Any]]:
    cand_spec = spec.model_copy(update={"replicas": replicas})
    cm = _retrack(desired_config_map(owner, cand_spec, None), owner.name)
    if priors is not None:  # carry the live priors over (pushed by the fleet loop); not in the hash
        cm["data"][c.CONFIG_KEY] = render_runtime_config(cand_spec, priors)
    dep = _retrack(desired_deployment(owner, cand_spec), owner.name)
    return [cm, dep]


# ------------------------------------------------------------------------------------------- I/O


def _apply(api: Api, desired: dict[str, Any], owner: Owner) -> dict[str, Any] | None:
    kind, name = desired["kind"], desired["metadata"]["name"]
    live = api.get(kind, owner.namespace, name)
    action = diff_plan(desired, live, owner.uid)
    if action is Action.NONE:
        return live
    if action is Action.CONFLICT:
        log.warning("%s %s exists and is owned by someone else; not touching it", kind, name)
        return None
    try:
        if action is Action.CREATE:
            return api.create(desired)
        assert live is not None
        return api.replace(update_body(desired, live))
    except ApiException as e:
        if e.status == 409:  # raced with another writer: the next tick compares again
            return live
        raise


def _delete(api: Api, kind: str, namespace: str, name: str) -> bool:
    try:
        api.request("DELETE", api.path(kind, namespace, name), {"propagationPolicy": "Background"})
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def patch_status(api: Api, namespace: str, name: str, uid: str,
                 fields: dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]) -> bool:
    """Merge-patch ``status`` fields against the freshest object (resourceVersion; retried on 409).
    ``fields`` may be a function of the fresh status (e.g. to set one condition in the fresh list).
    Returns False when the object is gone."""
    for attempt in range(4):
        fresh = api.get(c.KIND, namespace, name)
        if fresh is None or fresh["metadata"]["uid"] != uid:
            return False
        old = fresh.get("status") or {}
        want = fields(old) if callable(fields) else fields
        diff: dict[str, Any] = {}
        for k, v in want.items():
            if v is None:
                if old.get(k) is not None:
                    diff[k] = None
                continue
            d = merge_patch(old.get(k), v) if isinstance(old.get(k), dict) else (None if old.get(k) == v else v)
            if d is not None:
                diff[k] = d
        if not diff:
            return True
        try:
            api.patch_status(namespace, name, diff, fresh["metadata"]["resourceVersion"])
            return True
        except ApiException as e:
            if e.status == 409 and attempt < 3:
                continue
            raise
    return False


def _pair_status(rev: Revision | None, dep: dict[str, Any] | None, deployment: str, extra: dict[str, Any] | None = None) -> dict[str, Any] | None:
    if rev is None:
        return None
    ds = (dep or {}).get("status") or {}
    out = {
        "revision": rev.revision,
        "pair": rev.label,
        "target": (rev.pair.get("target") or {}).get("name"),
        "draft": (rev.pair.get("draft") or {}).get("name"),
        "deployment": deployment,
        "replicas": int(((dep or {}).get("spec") or {}).get("replicas") or 0),
        "readyReplicas": int(ds.get("readyReplicas") or 0),
    }
    out.update(extra or {})
    return out


def _analysis(state: RolloutState, current: dict[str, PodMetrics], tracks: dict[str, str], fm: Any,
              spec: NightjarDeploymentSpec) -> Analysis:
    per_track: dict[str, dict[str, PodMetrics]] = {c.TRACK_STABLE: {}, c.TRACK_CANDIDATE: {}}
    for uid, pm in current.items():
        tr = tracks.get(uid)
        if tr in per_track:
            per_track[tr][uid] = window(fm.rollout_baselines.get(uid), pm)
    cand, stab = aggregate(per_track[c.TRACK_CANDIDATE]), aggregate(per_track[c.TRACK_STABLE])
    slo = spec.slo
    ce = evaluate_slo(cand, slo.ttft_p95_ms, slo.tpot_p95_ms, slo.attainment)
    se = evaluate_slo(stab, slo.ttft_p95_ms, slo.tpot_p95_ms, slo.attainment)
    return Analysis(
        candidate_attainment=ce.attainment,
        stable_attainment=se.attainment,
        candidate_throughput_per_pod=per_pod(cand.throughput_tok_s, cand.pods),
        stable_throughput_per_pod=per_pod(stab.throughput_tok_s, stab.pods),
        candidate_requests=cand.requests,
        stable_requests=stab.requests,
        candidate_saturated=cand.waiting > 0,
        stable_saturated=stab.waiting > 0,
    )


def _window_key(s: RolloutState) -> tuple | None:
    if s.phase != "Progressing" or s.candidate is None:
        return None
    return (s.candidate.revision, s.step, s.window_started_at)


def tick(api: Api, body: dict[str, Any], spec: NightjarDeploymentSpec, current: dict[str, PodMetrics],
         targets: dict[str, Any], fm: Any, now: float, logger: Any = None) -> Plan:
    """One rollout round (see the module docstring). ``targets``: pod uid -> PodTarget (track)."""
    # The module logger, not kopf's per-object one: kopf would also post every line as an Event,
    # duplicating the explicit ones below.
    logger = log
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    owner = Owner.from_body(body)
    status = body.get("status") or {}
    state = RolloutState.from_status(status.get("rollout"))
    desired = desired_revision(spec)
    tracks = {uid: t.track for uid, t in targets.items()}

    analysis = None
    if state is not None and _window_key(state) is not None:
        if fm.rollout_key != _window_key(state):
            # Baselines of this window are not in memory (operator restarted): restart the window.
            state = restart_window(state, now)
            fm.rollout_key = _window_key(state)
            fm.rollout_baselines = dict(current)
            logger.info("rollout: analysis window of step %d restarted (no baselines in memory)", state.step + 1)
        else:
            for uid, pm in current.items():
                # A pod first seen during the window: its window starts at its first scrape, so
                # its rates cover only the time it was observed.
                fm.rollout_baselines.setdefault(uid, pm)
            analysis = _analysis(state, current, tracks, fm, spec)
    slo = spec.slo
    objective = slo.attainment if (slo.ttft_p95_ms or slo.tpot_p95_ms) else None
    gate = Gate(objective=objective, min_requests=5.0)
    steps = spec.rollout.steps if spec.rollout.strategy == "Canary" else None
    p = plan(state, desired, spec.replicas, steps, float(spec.rollout.analysis_window_seconds), now, analysis, gate,
             weighted=weighted(spec, api.served, status.get("conditions")))
    new_key = _window_key(p.state)
    if new_key is not None and new_key != fm.rollout_key:
        fm.rollout_key = new_key
        fm.rollout_baselines = dict(current)

    m = op_metrics()
    for type_, reason, message in p.events:
        api.post_event(body, type_, reason, message)
        logger.info("rollout %s/%s: %s: %s", namespace, name, reason, message)
    if p.state.last_decision is not None and (state is None or state.last_decision != p.state.last_decision):
        m["rollout_decisions"].labels(namespace, name, p.state.last_decision.action).inc()
    m["candidate_weight"].labels(namespace, name).set(p.state.weight / 100.0 if p.state.candidate else 0.0)

    # Children of the candidate track.
    cand_dep = None
    if p.state.candidate is not None:
        cm = api.get("ConfigMap", namespace, c.candidate_config_name(name))
        priors = live_priors(((cm or {}).get("data") or {}).get(c.CONFIG_KEY)) if cm else None
        for obj in candidate_children(owner, spec, p.candidate_replicas, priors):
            live = _apply(api, obj, owner)
            if obj["kind"] == "Deployment":
                cand_dep = live
    else:
        live_cand = api.get("Deployment", namespace, c.candidate_name(name))
        if live_cand is not None:
            drain = p.state.last_decision is not None and p.state.last_decision.action == "Promoted"
            stable_dep = api.get("Deployment", namespace, c.deployment_name(name))
            if drain and not _stable_caught_up(stable_dep, p.state.stable, spec.replicas):
                cand_dep = live_cand  # keep serving from the candidate until the promoted stable is ready
            else:
                _delete(api, "Deployment", namespace, c.candidate_name(name))
                _delete(api, "ConfigMap", namespace, c.candidate_config_name(name))
                api.post_event(body, "Normal", "CandidateRemoved", f"deleted {c.candidate_name(name)}")
        else:
            _delete(api, "ConfigMap", namespace, c.candidate_config_name(name))

    # Persist the state and the per-track summaries (printer columns Stable / Candidate).
    stable_dep = api.get("Deployment", namespace, c.deployment_name(name))
    fields: dict[str, Any] = {
        "rollout": p.state.to_status(),
        "stable": _pair_status(p.state.stable, stable_dep, c.deployment_name(name)),
        "candidate": _pair_status(p.state.candidate, cand_dep, c.candidate_name(name), {"weight": p.state.weight}),
    }
    changed_state = state is None or state.to_status() != p.state.to_status()
    patch_status(api, namespace, name, owner.uid, fields)
    if changed_state:
        # The stable Deployment follows the new state (pair, share of replicas): reconcile it now.
        try:
            from nightjar_operator.handlers.sync import reconcile

            fresh = api.get(c.KIND, namespace, name)
            if fresh is not None:
                reconcile(api, fresh, trigger="rollout")
        except Exception as e:  # noqa: BLE001 - the reconcile's own timer retries
            logger.warning("rollout: reconcile after state change failed: %s", e)
    return p


def _stable_caught_up(dep: dict[str, Any] | None, stable: Revision | None, replicas: int) -> bool:
    if dep is None or stable is None:
        return True
    ann = (dep.get("metadata") or {}).get("annotations") or {}
    pair_ok = ann.get(c.ANN_TARGET) == (stable.pair.get("target") or {}).get("name") and ann.get(c.ANN_DRAFT) == (
        stable.pair.get("draft") or {}
    ).get("name")
    ds = dep.get("status") or {}
    synced = int(ds.get("observedGeneration") or 0) >= int(dep["metadata"].get("generation") or 0)
    return pair_ok and synced and int(ds.get("updatedReplicas") or 0) >= replicas and int(ds.get("readyReplicas") or 0) >= replicas
