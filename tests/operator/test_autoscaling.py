"""spec.autoscaling: the HPA or KEDA ScaledObject the operator renders (pure), checked against the
upstream schemas (KEDA's, from the kubernetes-models npm package that ``make k8s-models`` installs),
and the validation messages naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import upstream_schema_errors
from nightjar_operator import constants as c
from nightjar_operator.crd.models import NightjarDeploymentSpec
from nightjar_operator.reconcile.autoscaling import default_query, desired_autoscaler, quantity
from nightjar_operator.reconcile.children import Owner
from nightjar_operator.reconcile.validate import semantic_errors

OWNER = Owner(name="chat", namespace="team-a", uid="u-1")


def spec(raw_spec: dict[str, Any], **autoscaling: Any) -> NightjarDeploymentSpec:
    return NightjarDeploymentSpec.model_validate({**raw_spec, "autoscaling": autoscaling})


def test_quantities():
    assert [quantity(v) for v in (4, 4.0, 0.5, 2.25)] == ["4", "4", "500m", "2250m"]


def test_off_by_default_renders_nothing(raw_spec):
    assert desired_autoscaler(OWNER, spec(raw_spec), lambda _: True) == (None, None)
    # Turned off after it was on: the condition says so (and the reconcile deletes the object).
    obj, cond = desired_autoscaler(OWNER, spec(raw_spec), lambda _: True, had_condition=True)
    assert obj is None and cond[:2] == ("False", "Disabled")


def test_hpa_scales_the_nightjar_deployment_on_waiting_requests(raw_spec):
    s = spec(raw_spec, engine="HPA", minReplicas=2, maxReplicas=8, waitingPerReplica=3, cooldownSeconds=120)
    # A 1.20 cluster serves autoscaling/v2beta2 only; a newer one v2.
    for served, version in (({"autoscaling/v2beta2"}, "autoscaling/v2beta2"),
                            ({"autoscaling/v2", "autoscaling/v2beta2"}, "autoscaling/v2")):
        hpa, cond = desired_autoscaler(OWNER, s, served.__contains__)
        assert hpa["apiVersion"] == version and cond[0] == "True"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": c.API_VERSION, "kind": c.KIND, "name": "chat"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    assert hpa["spec"]["metrics"] == [{"type": "Pods", "pods": {
        "metric": {"name": "vllm_num_requests_waiting"}, "target": {"type": "AverageValue", "averageValue": "3"}}}]
    assert hpa["spec"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 120}}
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    _, cond = desired_autoscaler(OWNER, s, lambda _: False)
    assert cond[:2] == ("False", "HPANotServed") and cond[2].startswith("spec.autoscaling.engine")


def test_keda_scaled_object_matches_the_upstream_schema(raw_spec):
    s = spec(raw_spec, engine="KEDA", minReplicas=0, maxReplicas=5, waitingPerReplica=2.5,
             prometheusUrl="http://prometheus-operated.monitoring:9090")
    obj, cond = desired_autoscaler(OWNER, s, lambda v: v == "keda.sh/v1alpha1")
    assert cond[:2] == ("True", "ScaledObject")
    assert obj["spec"]["scaleTargetRef"]["kind"] == c.KIND and obj["spec"]["minReplicaCount"] == 0
    (trigger,) = obj["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metadata"] == {"serverAddress": "http://prometheus-operated.monitoring:9090",
                                   "query": default_query("team-a", "chat"), "threshold": "2.5"}
    assert 'nightjar_deployment="chat"' in trigger["metadata"]["query"]
    # The check can fail: the same object with a bad field is refused by the same schema.
    bad = json.loads(json.dumps(obj))
    bad["spec"]["minReplicaCount"] = "zero"
    assert upstream_schema_errors([obj, bad]) == ["ok", "data/spec/minReplicaCount must be integer"]
    _, cond = desired_autoscaler(OWNER, s, lambda _: False)
    assert cond[:2] == ("False", "KEDANotInstalled") and cond[2].startswith("spec.autoscaling.engine")


@pytest.mark.parametrize(("autoscaling", "field"), [
    ({"engine": "HPA", "minReplicas": 0}, "spec.autoscaling.minReplicas"),
    ({"engine": "HPA", "minReplicas": 5, "maxReplicas": 2}, "spec.autoscaling.maxReplicas"),
    ({"engine": "KEDA"}, "spec.autoscaling.prometheusUrl"),
])  # fmt: skip
def test_invalid_autoscaling_names_the_field(raw_spec, autoscaling, field):
    errs = semantic_errors(spec(raw_spec, **autoscaling), "chat")
    assert [e.field for e in errs] == [field], errs
