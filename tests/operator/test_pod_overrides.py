"""spec.pod (worker pod overrides), spec.drain and the rolling strategy: rendering and validation."""

from __future__ import annotations

import copy

import pytest
from nightjar_operator import constants as c
from nightjar_operator.reconcile.children import Owner, desired_deployment, override_field
from nightjar_operator.reconcile.validate import parse_spec, semantic_errors

OWNER = Owner(name="pool", namespace="serving", uid="u-1")
OVERRIDES = {
    "nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100", "h200"]}]}]}}},
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "ScheduleAnyway"}],
    "runtimeClassName": "nvidia",
    "priorityClassName": "inference-high",
    "serviceAccountName": "llm-workers",
    "imagePullSecrets": [{"name": "registry-creds"}],
    "labels": {"team": "search"},
    "annotations": {"sidecar.istio.io/inject": "false"},
    "env": [{"name": "TRANSFORMERS_VERBOSITY", "value": "error"},
            {"name": "S3_KEY", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "key"}}}],
    "envFrom": [{"configMapRef": {"name": "app-settings"}, "prefix": "APP_"}],
    "volumes": [{"name": "extra-cache", "persistentVolumeClaim": {"claimName": "compile-cache"}}],
    "volumeMounts": [{"name": "extra-cache", "mountPath": "/var/lib/extra"}],
}


def _spec(raw, **extra):
    raw = {**copy.deepcopy(raw), **extra}
    spec, errs = parse_spec(raw)
    assert spec is not None, errs
    return spec, [str(e) for e in semantic_errors(spec, "pool")]


def test_overrides_render_into_the_worker_pod(raw_spec):
    spec, errs = _spec(raw_spec, pod=OVERRIDES, resources={"gpus": 2, "acceleratorResource": "amd.com/gpu"})
    assert errs == []
    dep = desired_deployment(OWNER, spec)
    pod = dep["spec"]["template"]["spec"]
    ctr = pod["containers"][0]
    for key in ("nodeSelector", "affinity", "runtimeClassName", "priorityClassName", "serviceAccountName",
                "imagePullSecrets", "tolerations"):
        assert pod[key] == OVERRIDES[key], key
    (tsc,) = pod["topologySpreadConstraints"]
    assert tsc["labelSelector"] == {"matchLabels": {c.LABEL_NAME: c.WORKER_APP, c.LABEL_DEPLOYMENT: "pool"}}
    assert pod["automountServiceAccountToken"] is False  # a workers' ServiceAccount still gets no token
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "search" and labels[c.LABEL_DEPLOYMENT] == "pool"
    assert dep["spec"]["template"]["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    names = [e["name"] for e in ctr["env"]]
    assert names[0] == "NIGHTJAR_CONFIG" and names[-2:] == ["TRANSFORMERS_VERBOSITY", "S3_KEY"]
    assert ctr["envFrom"] == [{"configMapRef": {"name": "app-settings"}, "prefix": "APP_"}]
    assert pod["volumes"][-1]["name"] == "extra-cache" and ctr["volumeMounts"][-1]["mountPath"] == "/var/lib/extra"
    assert ctr["resources"]["limits"]["amd.com/gpu"] == "2" and "nvidia.com/gpu" not in str(ctr["resources"])
    # The 422 of the apiserver names the rendered field; the condition names the spec field.
    own = len(pod["volumes"]) - 1
    assert override_field(f"spec.template.spec.volumes[{own}].persistentVolumeClaim.claimName", pod) == \
        "spec.pod.volumes[0].persistentVolumeClaim.claimName"
    own_env = len(ctr["env"]) - 2
    assert override_field(f"spec.template.spec.containers[0].env[{own_env + 1}].valueFrom", pod) == \
        "spec.pod.env[1].valueFrom"
    assert override_field("spec.template.spec.affinity.nodeAffinity", pod) == "spec.pod.affinity.nodeAffinity"


def test_drain_prestop_grace_and_a_strategy_that_keeps_a_replica(raw_spec):
    spec, _ = _spec(raw_spec, drain={"preStopDelaySeconds": 7, "drainSeconds": 120}, replicas=1,
                    resources={"gpus": 1})
    dep = desired_deployment(OWNER, spec)
    pod = dep["spec"]["template"]["spec"]
    ctr = pod["containers"][0]
    assert ctr["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "7"]
    assert pod["terminationGracePeriodSeconds"] == 7 + 120 + 15
    assert ctr["args"][ctr["args"].index("--shutdown-timeout") + 1] == "120"
    # One replica: its successor must be Ready first, GPU or not.
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    spec, _ = _spec(raw_spec, replicas=4, resources={"gpus": 1})
    assert desired_deployment(OWNER, spec)["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    spec, _ = _spec(raw_spec, replicas=4)
    assert desired_deployment(OWNER, spec)["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


@pytest.mark.parametrize(("pod", "field", "words"), [
    ({"labels": {c.LABEL_DEPLOYMENT: "x"}}, f"spec.pod.labels[{c.LABEL_DEPLOYMENT}]", "set by the operator"),
    ({"labels": {"bad key!": "x"}}, "spec.pod.labels[bad key!]", "not a valid label key"),
    ({"env": [{"name": "NIGHTJAR_CONFIG", "value": "/x"}]}, "spec.pod.env[0].name", "reserved"),
    ({"env": [{"name": "HF_TOKEN", "value": "t"}]}, "spec.pod.env[0].name", "spec.hub"),
    ({"env": [{"name": "A"}]}, "spec.pod.env[0]", "exactly one of value and valueFrom"),
    ({"volumes": [{"name": "cache", "emptyDir": {}}]}, "spec.pod.volumes[0].name", "operator's"),
    ({"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]}, "spec.pod.volumes[1].name", "duplicate"),
    ({"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}, "spec.pod.volumeMounts[0].name", "no volume nope"),
    ({"volumes": [{"name": "a", "emptyDir": {}}], "volumeMounts": [{"name": "a", "mountPath": "/models/x"}]},
     "spec.pod.volumeMounts[0].mountPath", "overlaps /models"),
    ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "spec.pod.tolerations[0].value", "Exists"),
    ({"volumes": [{"emptyDir": {}}]}, "spec.pod.volumes[0].name", "required"),
])
def test_overrides_that_would_shadow_the_operator_are_refused(raw_spec, pod, field, words):
    _, errs = _spec(raw_spec, pod=pod)
    assert any(e.startswith(field + ":") and words in e for e in errs), errs


@pytest.mark.parametrize(("pod", "field"), [
    ({"tolerations": [{"operator": "Sometimes"}]}, "spec.pod.tolerations.0.operator"),
    ({"runtimeClassName": "Not_A_Name"}, "spec.pod.runtimeClassName"),
])
def test_schema_level_override_errors(raw_spec, pod, field):
    spec, errs = parse_spec({**raw_spec, "pod": pod})
    assert spec is None and any(str(e).replace("[", ".").replace("]", "").startswith(field) for e in errs), errs


def test_disruption_budget_on_by_default_above_one_replica(raw_spec):
    from nightjar_operator.reconcile.children import desired_children, desired_pdb

    spec, _ = _spec(raw_spec, replicas=2)
    pdb = desired_pdb(OWNER, spec, "policy/v1beta1")
    assert pdb["apiVersion"] == "policy/v1beta1" and pdb["spec"]["maxUnavailable"] == 1
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert [o["kind"] for o in desired_children(OWNER, spec)][-1] == "PodDisruptionBudget"
    assert desired_pdb(OWNER, _spec(raw_spec, replicas=1)[0]) is None
    assert desired_pdb(OWNER, _spec(raw_spec, replicas=1, disruptionBudget={"enabled": True})[0]) is not None
    assert desired_pdb(OWNER, _spec(raw_spec, replicas=5, disruptionBudget={"enabled": False})[0]) is None
    assert parse_spec({**raw_spec, "disruptionBudget": {"maxUnavailable": "lots"}})[0] is None
