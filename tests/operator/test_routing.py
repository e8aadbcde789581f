"""spec.routing: the InferencePool and HTTPRoute the operator renders (pure), the canary's share as
HTTPRoute weights or as replicas, the HTTPRoute checked against the upstream Gateway API schema
(from the kubernetes-models npm package that ``make k8s-models`` installs), and validation messages
naming the field. tests/operator/test_operator_cluster.py applies them to a real apiserver."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from helpers import upstream_schema_errors
from nightjar_operator import constants as c
from nightjar_operator.crd.models import NightjarDeploymentSpec
from nightjar_operator.fleet.rollout import candidate_weight, split_replicas, stable_spec
from nightjar_operator.reconcile.children import Owner, pod_selector, service_selector
from nightjar_operator.reconcile.routing import GATEWAY_VERSION, POOL_VERSION, desired_routing, weighted
from nightjar_operator.reconcile.validate import semantic_errors

OWNER = Owner(name="chat", namespace="team-a", uid="u-1")
ROUTE = {"parentRefs": [{"name": "inference-gateway", "namespace": "gateway-system", "sectionName": "http"}],
         "hostnames": ["chat.example.com"]}  # fmt: skip
POOL = {"endpointPicker": {"name": "chat-epp"}}
TWO_POOLS = {"endpointPicker": {"name": "chat-epp"}, "candidateEndpointPicker": {"name": "chat-epp-canary", "failureMode": "FailOpen"}}


def every(_: str) -> bool:
    return True


def spec(raw_spec: dict[str, Any], **routing: Any) -> NightjarDeploymentSpec:
    return NightjarDeploymentSpec.model_validate({**raw_spec, "routing": routing})


def rollout_status(weight: int) -> dict[str, Any]:
    rev = {"revision": "r1", "pair": {}}
    return {"rollout": {"phase": "Progressing", "stable": rev, "candidate": {**rev, "revision": "r2"}, "weight": weight}}


def by_kind(objs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for o in objs:
        out.setdefault(o["kind"], []).append(o)
    return out


def test_off_by_default_renders_nothing(raw_spec):
    assert desired_routing(OWNER, spec(raw_spec), every, 0) == ([], None)
    objs, cond = desired_routing(OWNER, spec(raw_spec), every, 0, had_condition=True)
    assert objs == [] and cond[:2] == ("False", "Disabled")
    assert not weighted(spec(raw_spec), every)


def test_pool_and_route_with_a_weighted_canary(raw_spec):
    s = spec(raw_spec, httpRoute=ROUTE, inferencePool=TWO_POOLS)
    assert weighted(s, every)
    objs, cond = desired_routing(OWNER, s, every, 0)
    k = by_kind(objs)
    assert [o["kind"] for o in objs] == ["InferencePool", "HTTPRoute"]  # backends before the route
    (pool,) = k["InferencePool"]
    assert pool["apiVersion"] == POOL_VERSION and pool["metadata"]["name"] == "chat"
    assert pool["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert pool["spec"] == {
        "selector": {"matchLabels": pod_selector("chat", c.TRACK_STABLE)},
        "targetPorts": [{"number": c.HTTP_PORT}],
        "endpointPickerRef": {"kind": "Service", "name": "chat-epp", "port": {"number": 9002}, "failureMode": "FailClose"},
    }
    (route,) = k["HTTPRoute"]
    assert route["apiVersion"] == GATEWAY_VERSION
    assert route["spec"]["parentRefs"] == ROUTE["parentRefs"] and route["spec"]["hostnames"] == ["chat.example.com"]
    (rule,) = route["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert rule["backendRefs"] == [{"name": "chat", "weight": 100, "group": "inference.networking.k8s.io", "kind": "InferencePool"}]
    assert cond[:2] == ("True", "Routed") and "HTTPRoute weights" in cond[2]

    # A rollout at 10 %: a second pool over the candidate's pods with its own picker, weights 90/10.
    objs, cond = desired_routing(OWNER, s, every, 10)
    pools = {p["metadata"]["name"]: p for p in by_kind(objs)["InferencePool"]}
    cand = pools[c.candidate_name("chat")]
    assert cand["spec"]["selector"]["matchLabels"] == pod_selector("chat", c.TRACK_CANDIDATE)
    assert cand["spec"]["endpointPickerRef"]["name"] == "chat-epp-canary"
    assert cand["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"
    route = by_kind(objs)["HTTPRoute"][0]
    assert [(b["name"], b["weight"]) for b in route["spec"]["rules"][0]["backendRefs"]] == [("chat", 90), ("chat-candidate", 10)]
    assert "now 90/10" in cond[2]
    # The upstream schema accepts it; the check can fail (a negative weight is refused).
    bad = copy.deepcopy(route)
    bad["spec"]["rules"][0]["backendRefs"][0]["weight"] = -1
    errors = upstream_schema_errors([route, bad])
    assert errors[0] == "ok" and "weight" in errors[1] and "must be >= 0" in errors[1], errors


def test_weighted_canary_keeps_every_stable_replica(raw_spec):
    s = spec(raw_spec, httpRoute=ROUTE, inferencePool=TWO_POOLS).model_copy(update={"replicas": 4})
    status = rollout_status(10)
    assert candidate_weight(status) == 10 and candidate_weight({}) == 0
    assert stable_spec(s, status, weighted=True).replicas == 4
    assert stable_spec(s, status, weighted=False).replicas == 3
    assert split_replicas(4, 10, weighted=True) == (4, 1)
    assert split_replicas(4, 50, weighted=True) == (4, 2)
    assert split_replicas(4, 100, weighted=True) == (4, 4)  # stable stays until promotion: rollback is instant
    assert split_replicas(0, 50, weighted=True) == (0, 0)


def test_one_pool_without_a_candidate_picker_splits_replicas(raw_spec):
    s = spec(raw_spec, httpRoute=ROUTE, inferencePool=POOL)
    assert not weighted(s, every)
    objs, cond = desired_routing(OWNER, s, every, 50)
    (pool,) = by_kind(objs)["InferencePool"]
    assert pool["spec"]["selector"]["matchLabels"] == service_selector("chat")  # both revisions
    (ref,) = by_kind(objs)["HTTPRoute"][0]["spec"]["rules"][0]["backendRefs"]
    assert (ref["name"], ref["weight"]) == ("chat", 100)
    assert "a share of the replicas" in cond[2]
    # A pool alone (no Gateway route): just the pool.
    objs, cond = desired_routing(OWNER, spec(raw_spec, inferencePool=POOL), every, 0)
    assert [o["kind"] for o in objs] == ["InferencePool"] and cond[0] == "True"


def test_route_to_services_per_revision(raw_spec):
    s = spec(raw_spec, httpRoute={**ROUTE, "pathPrefix": "/v1"})
    assert weighted(s, every)
    objs, _ = desired_routing(OWNER, s, every, 25)
    svcs = {o["metadata"]["name"]: o for o in by_kind(objs)["Service"]}
    assert svcs["chat-stable"]["spec"]["selector"] == pod_selector("chat", c.TRACK_STABLE)
    assert svcs["chat-candidate"]["spec"]["selector"] == pod_selector("chat", c.TRACK_CANDIDATE)
    route = by_kind(objs)["HTTPRoute"][0]
    (rule,) = route["spec"]["rules"]
    assert rule["matches"][0]["path"]["value"] == "/v1"
    assert rule["backendRefs"] == [{"name": "chat-stable", "weight": 75, "kind": "Service", "port": c.HTTP_PORT},
                                   {"name": "chat-candidate", "weight": 25, "kind": "Service", "port": c.HTTP_PORT}]
    assert upstream_schema_errors([route]) == ["ok"]
    # The chart's RBAC forbids HTTPRoutes: the reconcile reports it and splits replicas, and the
    # rollout (which reads that condition) sizes the candidate the same way.
    forbidden = [{"type": c.COND_ROUTING, "status": "False", "reason": "Forbidden"}]
    assert not weighted(s, every, forbidden)
    assert weighted(s, every, [{**forbidden[0], "status": "True", "reason": "Routed"}])


@pytest.mark.parametrize(("routing", "served", "field"), [
    ({"inferencePool": POOL}, {GATEWAY_VERSION}, "spec.routing.inferencePool"),
    ({"httpRoute": ROUTE}, {POOL_VERSION}, "spec.routing.httpRoute"),
    ({"httpRoute": ROUTE, "inferencePool": TWO_POOLS}, {GATEWAY_VERSION}, "spec.routing.inferencePool"),
])  # fmt: skip
def test_kinds_the_cluster_does_not_serve_render_nothing(raw_spec, routing, served, field):
    s = spec(raw_spec, **routing)
    objs, cond = desired_routing(OWNER, s, served.__contains__, 10)
    assert objs == [] and cond[:2] == ("False", "NotInstalled") and cond[2].startswith(f"{field}:"), cond
    assert "Service chat" in cond[2]
    assert not weighted(s, served.__contains__)


@pytest.mark.parametrize(("routing", "name", "field"), [
    ({"inferencePool": TWO_POOLS}, "chat", "spec.routing.inferencePool.candidateEndpointPicker"),
    ({"httpRoute": ROUTE, "inferencePool": {"endpointPicker": {"name": "epp"}, "candidateEndpointPicker": {"name": "epp"}}},
     "chat", "spec.routing.inferencePool.candidateEndpointPicker.name"),
    ({"httpRoute": ROUTE}, "a" * 54, "metadata.name"),
])  # fmt: skip
def test_invalid_routing_names_the_field(raw_spec, routing, name, field):
    errs = semantic_errors(spec(raw_spec, **routing), name)
    assert [e.field for e in errs] == [field], errs


def test_schema_refuses_bad_values(raw_spec):
    from nightjar_operator.reconcile.validate import parse_spec

    bad = {**raw_spec, "routing": {"httpRoute": {"parentRefs": []}, "inferencePool": {"endpointPicker": {"name": "e", "failureMode": "Maybe"}}}}
    _, errs = parse_spec(bad)
    fields = {e.field for e in errs}
    assert {"spec.routing.httpRoute.parentRefs", "spec.routing.inferencePool.endpointPicker.failureMode"} <= fields, errs
