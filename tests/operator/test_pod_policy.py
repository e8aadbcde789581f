"""A CR is not a privilege escalation: spec.pod volumes from an allowlist, envFrom that cannot reach
the worker's own variables. Pure (the same validate() the reconcile and the webhook run)."""

from __future__ import annotations

import copy

import pytest
from nightjar_operator.handlers.settings import ENV_EXTRA_VOLUME_TYPES, pod_policy
from nightjar_operator.reconcile.validate import PodPolicy, env_prefix_reaches, reserved_env, validate

TOKEN = {"serviceAccountToken": {"path": "token", "audience": "vault"}}


def _errors(raw_spec, pod, policy=None):
    spec, errs = validate({**copy.deepcopy(raw_spec), "pod": pod}, "pool", policy or PodPolicy())
    assert spec is not None, errs
    return [str(e) for e in errs]


@pytest.mark.parametrize("volume", [
    {"name": "v", "configMap": {"name": "c"}},
    {"name": "v", "secret": {"secretName": "s"}},
    {"name": "v", "emptyDir": {"medium": "Memory"}},
    {"name": "v", "persistentVolumeClaim": {"claimName": "p"}},
    {"name": "v", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
    {"name": "v", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
    {"name": "v", "projected": {"sources": [{"configMap": {"name": "c"}}, {"secret": {"name": "s"}},
                                            {"downwardAPI": {"items": []}}]}},
])
def test_allowlisted_volumes_pass(raw_spec, volume):
    assert _errors(raw_spec, {"volumes": [volume]}) == []


@pytest.mark.parametrize(("volume", "field"), [
    ({"name": "v", "hostPath": {"path": "/var/run/docker.sock"}}, "spec.pod.volumes[0].hostPath"),
    ({"name": "v", "csi": {"driver": "secrets-store.csi.k8s.io"}}, "spec.pod.volumes[0].csi"),
    ({"name": "v", "nfs": {"server": "nfs", "path": "/"}}, "spec.pod.volumes[0].nfs"),
    ({"name": "v", "projected": {"sources": [{"configMap": {"name": "c"}}, TOKEN]}},
     "spec.pod.volumes[0].projected.sources[1].serviceAccountToken"),
])
def test_volumes_off_the_allowlist_are_refused_naming_the_field(raw_spec, volume, field):
    errs = _errors(raw_spec, {"volumes": [volume]})
    assert len(errs) == 1 and errs[0].startswith(field + ": ") and "operator.podPolicy.extraVolumeTypes" in errs[0], errs


def test_a_cluster_admin_widens_the_allowlist(raw_spec, monkeypatch):
    host = {"name": "v", "hostPath": {"path": "/data"}}
    projected = {"name": "w", "projected": {"sources": [TOKEN]}}
    assert len(_errors(raw_spec, {"volumes": [host, projected]}, pod_policy())) == 2
    monkeypatch.setenv(ENV_EXTRA_VOLUME_TYPES, "hostPath, serviceAccountToken")  # what the chart renders
    assert pod_policy() == PodPolicy(frozenset({"hostPath", "serviceAccountToken"}))
    assert _errors(raw_spec, {"volumes": [host, projected]}, pod_policy()) == []
    # Widening hostPath does not widen csi.
    assert _errors(raw_spec, {"volumes": [{"name": "c", "csi": {"driver": "x"}}]}, pod_policy())


@pytest.mark.parametrize(("prefix", "reaches"), [
    (None, "NIGHTJAR_*"), ("", "NIGHTJAR_*"), ("NIGHTJAR", "NIGHTJAR_*"), ("NIGHTJAR_X_", "NIGHTJAR_*"), ("H", "HF_*"),
    ("V", "VLLM_*"), ("POD_", "POD_NAME"), ("HO", "HOME"),
])
def test_env_from_that_could_set_a_reserved_name_is_refused(raw_spec, prefix, reaches):
    ref = {"configMapRef": {"name": "settings"}, **({"prefix": prefix} if prefix is not None else {})}
    errs = _errors(raw_spec, {"envFrom": [{"secretRef": {"name": "ok"}, "prefix": "APP_"}, ref]})
    assert len(errs) == 1 and errs[0].startswith("spec.pod.envFrom[1].prefix: ") and reaches in errs[0], errs


@pytest.mark.parametrize("prefix", ["APP_", "S3_", "HOME", "HOMER_", "XNIGHTJAR_", "PODS_"])
def test_env_from_with_a_safe_prefix_passes(raw_spec, prefix):
    assert env_prefix_reaches(prefix) is None
    assert _errors(raw_spec, {"envFrom": [{"configMapRef": {"name": "settings"}, "prefix": prefix}]}) == []


def test_one_definition_of_the_reserved_names():
    """spec.pod.env and envFrom refuse the same names: whatever prefix+key could produce is refused
    by env too (checked over every reserved spelling the worker uses)."""
    for name in ("NIGHTJAR_CONFIG", "NIGHTJAR_API_KEY", "HF_TOKEN", "VLLM_API_KEY", "HOME", "POD_NAME",
                 "PROMETHEUS_MULTIPROC_DIR"):
        assert reserved_env(name)
        for cut in range(len(name)):
            assert env_prefix_reaches(name[:cut]) is not None, (name, cut)
    assert not reserved_env("APP_NIGHTJAR_CONFIG")
