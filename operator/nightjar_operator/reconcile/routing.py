"""Gateway API children of a NightjarDeployment (``spec.routing``). Pure.

An InferencePool (Gateway API Inference Extension, ``inference.networking.k8s.io/v1``) lets an
endpoint picker (the extension's or llm-d's) choose the worker for each request by its queue and
KV cache; an HTTPRoute (``gateway.networking.k8s.io/v1``) attaches the workers to Gateways.

The rollout's canary share goes one of two ways:
- **weights**: the HTTPRoute has one backend per revision (a pool each, or a Service each) with
  weights 100-w / w, and the stable revision keeps all its replicas (``split_replicas``);
- **replicas**: one backend spans both revisions and the share is a share of the pods (the one
  Service, or one pool when the candidate has no endpoint picker of its own: a picker serves one
  pool).

A piece the cluster does not serve renders nothing at all (no route to a pool that cannot exist):
the Routing condition names the field, and the workers stay reachable through their Service.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nightjar_operator import constants as c
from nightjar_operator.crd.models import EndpointPickerRef, NightjarDeploymentSpec
from nightjar_operator.reconcile.children import (
    Owner,
    _meta,
    _with_hash,
    desired_service,
    pod_selector,
    service_selector,
)
from nightjar_operator.reconcile.status import Condition, get_condition

GATEWAY_VERSION = "gateway.networking.k8s.io/v1"
POOL_GROUP = "inference.networking.k8s.io"
POOL_VERSION = f"{POOL_GROUP}/v1"

def track_service_name(name: str, track: str) -> str:
    return c.candidate_name(name) if track == c.TRACK_CANDIDATE else f"{name}-{track}"


def pool_name(name: str, track: str) -> str:
    return c.candidate_name(name) if track == c.TRACK_CANDIDATE else name


def possible_children(name: str) -> list[tuple[str, str]]:
    """(kind, name) of every object this module may render for ``name``: what the reconcile reads
    to find what to update or delete."""
    tracks = (c.TRACK_STABLE, c.TRACK_CANDIDATE)
    return ([("InferencePool", pool_name(name, t)) for t in tracks]
            + [("Service", track_service_name(name, t)) for t in tracks] + [("HTTPRoute", name)])  # fmt: skip


def weighted(spec: NightjarDeploymentSpec, served: Callable[[str], bool],
             conditions: list[dict[str, Any]] | None = None) -> bool:
    """Whether a rollout's share goes through HTTPRoute weights (else through replicas).
    ``conditions``: the status's; a Routing condition ``Forbidden`` (the chart's RBAC leaves the
    route to the user) means the replica split, as the reconcile that wrote it falls back to."""
    r = spec.routing
    if r.http_route is None or not served(GATEWAY_VERSION):
        return False
    if (cond := get_condition(conditions, c.COND_ROUTING)) is not None and cond.get("reason") == "Forbidden":
        return False
    if r.inference_pool is None:
        return True
    return r.inference_pool.candidate_endpoint_picker is not None and served(POOL_VERSION)


def desired_pool(owner: Owner, name: str, selector: dict[str, str], epp: EndpointPickerRef) -> dict[str, Any]:
    obj = {
        "apiVersion": POOL_VERSION,
        "kind": "InferencePool",
        "metadata": _meta(owner, name),
        "spec": {
            "selector": {"matchLabels": selector},
            "targetPorts": [{"number": c.HTTP_PORT}],
            "endpointPickerRef": {"kind": "Service", "name": epp.name, "port": {"number": epp.port},
                                  "failureMode": epp.failure_mode},
        },
    }  # fmt: skip
    return _with_hash(obj)


def desired_http_route(owner: Owner, spec: NightjarDeploymentSpec, backends: list[tuple[dict[str, Any], int]]) -> dict[str, Any]:
    """``backends``: (pool or Service, weight) pairs."""
    route = spec.routing.http_route
    assert route is not None
    refs = []
    for obj, weight in backends:
        ref = {"name": obj["metadata"]["name"], "weight": weight}
        if obj["kind"] == "InferencePool":
            ref.update(group=POOL_GROUP, kind="InferencePool")
        else:
            ref.update(kind="Service", port=c.HTTP_PORT)
        refs.append(ref)
    body: dict[str, Any] = {
        "parentRefs": [p.wire() for p in route.parent_refs],
        "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": route.path_prefix}}], "backendRefs": refs}],
    }
    if route.hostnames:
        body["hostnames"] = list(route.hostnames)
    return _with_hash({"apiVersion": GATEWAY_VERSION, "kind": "HTTPRoute", "metadata": _meta(owner, owner.name), "spec": body})


def desired_routing(owner: Owner, spec: NightjarDeploymentSpec, served: Callable[[str], bool], candidate_weight: int,
                    had_condition: bool = False) -> tuple[list[dict[str, Any]], Condition | None]:
    """The routing children to have, in apply order (backends before the route), and the Routing
    condition (None: leave it out; it is only written once routing was asked for).
    ``candidate_weight``: the rollout's current share in percent (0: no candidate)."""
    r = spec.routing
    svc = c.service_name(owner.name)
    if r.http_route is None and r.inference_pool is None:
        return [], (("False", "Disabled", "spec.routing is empty: the workers are reachable through "
                     f"Service {svc} only") if had_condition else None)  # fmt: skip
    for field, version, what in (("inferencePool", POOL_VERSION, "the Gateway API Inference Extension's CRDs"),
                                 ("httpRoute", GATEWAY_VERSION, "the Gateway API CRDs")):
        asked = r.inference_pool if field == "inferencePool" else r.http_route
        if asked is not None and not served(version):
            return [], ("False", "NotInstalled", f"spec.routing.{field}: this cluster does not serve {version} "
                        f"(install {what}); nothing is routed by the operator, the workers are reachable "
                        f"through Service {svc}")  # fmt: skip
    split = weighted(spec, served)
    tracks = [c.TRACK_STABLE] + ([c.TRACK_CANDIDATE] if split and candidate_weight > 0 else [])
    weights = {c.TRACK_STABLE: 100 - candidate_weight, c.TRACK_CANDIDATE: candidate_weight} if len(tracks) > 1 else {c.TRACK_STABLE: 100}

    backends: list[dict[str, Any]] = []
    if r.inference_pool is not None:
        p = r.inference_pool
        for t in tracks:
            # Without a picker of its own the candidate's pods join the stable pool (replica split).
            selector = pod_selector(owner.name, t) if split else service_selector(owner.name)
            epp = p.candidate_endpoint_picker if t == c.TRACK_CANDIDATE else p.endpoint_picker
            assert epp is not None
            backends.append(desired_pool(owner, pool_name(owner.name, t), selector, epp))
        picker = p.endpoint_picker
        what = f"InferencePool {owner.name} (endpoint picker {picker.name}:{picker.port}, {picker.failure_mode})"
    elif r.http_route is not None:
        backends = [desired_service(owner, track_service_name(owner.name, t), pod_selector(owner.name, t)) for t in tracks]
        what = f"Service {track_service_name(owner.name, c.TRACK_STABLE)}"
    out = list(backends)
    if r.http_route is not None:
        out.append(desired_http_route(owner, spec, [(b, weights[t]) for b, t in zip(backends, tracks, strict=True)]))
        what = f"HTTPRoute {owner.name} -> {what}"
    share = "HTTPRoute weights" if split else "a share of the replicas"
    now = f"; now {weights[c.TRACK_STABLE]}/{candidate_weight} stable/candidate" if len(tracks) > 1 else ""
    return out, ("True", "Routed", f"{what}; a rollout's canary share: {share}{now}")
