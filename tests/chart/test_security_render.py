"""The chart's trust-boundary objects rendered by the real helm: aggregated roles, the admission
webhook (both certificate modes) and the pod policy value (docs/security.md)."""

from __future__ import annotations

import pytest
from helmutil import CHART, render, run_helm
from nightjar_operator.handlers.settings import ENV_EXTRA_VOLUME_TYPES
from nightjar_operator.reconcile.admission import WEBHOOK_NAME, WEBHOOK_PATH
from nightjar_operator.reconcile.validate import PodPolicy

pytestmark = pytest.mark.helm

NJD = "nightjardeployments"


def _verbs(role: dict) -> set[tuple[str, str]]:
    return {(res, v) for r in role["rules"] for res in r["resources"] for v in r["verbs"]}


def test_aggregated_roles(helm):
    objs = render(helm)
    view, edit = objs.one("ClusterRole", "nightjar-view"), objs.one("ClusterRole", "nightjar-edit")
    agg = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k, v in view["metadata"]["labels"].items() if k.startswith(agg) and v == "true"} == {
        agg + "view", agg + "edit", agg + "admin"}
    assert {k for k, v in edit["metadata"]["labels"].items() if k.startswith(agg) and v == "true"} == {
        agg + "edit", agg + "admin"}  # never view: a NightjarDeployment makes pods
    assert {v for _, v in _verbs(view)} == {"get", "list", "watch"}
    assert {r for r, _ in _verbs(view)} == {NJD, f"{NJD}/status", f"{NJD}/scale"}
    assert _verbs(edit) == {(NJD, v) for v in ("create", "update", "patch", "delete", "deletecollection")} | {
        (f"{NJD}/scale", "update"), (f"{NJD}/scale", "patch")}  # status stays the operator's
    assert all(r["apiGroups"] == ["nightjar.dev"] for role in (view, edit) for r in role["rules"])
    off = render(helm, sets=["rbac.aggregatedRoles=false"])
    assert not [r for r in off.of("ClusterRole") if r["metadata"]["name"] in ("nightjar-view", "nightjar-edit")]


def test_webhook_with_operator_managed_certificates(helm):
    objs = render(helm)
    dep = objs.one("Deployment", "nightjar-operator")
    ctr = dep["spec"]["template"]["spec"]["containers"][0]
    vwc = objs.one("ValidatingWebhookConfiguration", "nightjar-operator")
    (hook,) = vwc["webhooks"]
    assert hook["name"] == WEBHOOK_NAME and hook["admissionReviewVersions"] == ["v1"]
    assert hook["sideEffects"] == "None" and hook["failurePolicy"] == "Fail"
    assert hook["clientConfig"] == {"service": {"name": "nightjar-operator-webhook", "namespace": "nightjar-system",
                                                "path": WEBHOOK_PATH, "port": 443}}
    assert hook["rules"] == [{"apiGroups": ["nightjar.dev"], "apiVersions": ["v1alpha1"], "resources": [NJD],
                              "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}]
    # Every replica serves it: the Service selects the Deployment's pods, not a leader.
    svc = objs.one("Service", "nightjar-operator-webhook")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"] == [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in ctr["ports"]
    assert [a for a in ctr["args"] if a.startswith("--webhook")] == [
        "--webhook-port=9443", "--webhook-secret=nightjar-system/nightjar-operator-webhook-tls",
        "--webhook-configuration=nightjar-operator", "--webhook-host=nightjar-operator-webhook.nightjar-system.svc",
        "--webhook-host=nightjar-operator-webhook.nightjar-system.svc.cluster.local"]
    # The Secret is the chart's (empty: the operator fills it) and the operator may touch only it
    # and its own webhook configuration.
    secret = objs.one("Secret", "nightjar-operator-webhook-tls")
    assert "data" not in secret and secret["type"] == "Opaque"
    role = objs.one("Role", "nightjar-operator-webhook")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"],
                              "resourceNames": ["nightjar-operator-webhook-tls"], "verbs": ["get", "update"]}]
    crole = objs.one("ClusterRole", "nightjar-operator-webhook")
    assert crole["rules"] == [{"apiGroups": ["admissionregistration.k8s.io"],
                               "resources": ["validatingwebhookconfigurations"],
                               "resourceNames": ["nightjar-operator"], "verbs": ["get", "patch"]}]
    assert objs.one("ClusterRoleBinding", "nightjar-operator-webhook")["roleRef"]["name"] == "nightjar-operator-webhook"
    assert not objs.of("Certificate")


def test_webhook_with_cert_manager(helm):
    objs = render(helm, sets=["webhook.certificates=cert-manager", "webhook.failurePolicy=Ignore"])
    vwc = objs.one("ValidatingWebhookConfiguration")
    assert vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "nightjar-system/nightjar-operator-webhook"
    assert vwc["webhooks"][0]["failurePolicy"] == "Ignore"
    cert = objs.one("Certificate", "nightjar-operator-webhook")
    assert cert["spec"]["secretName"] == "nightjar-operator-webhook-tls"
    assert cert["spec"]["dnsNames"][0] == "nightjar-operator-webhook.nightjar-system.svc"
    assert cert["spec"]["issuerRef"] == {"kind": "Issuer", "name": "nightjar-operator-webhook"}
    assert objs.one("Issuer")["spec"] == {"selfSigned": {}}
    pod = objs.one("Deployment")["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert "--webhook-cert-dir=/etc/nightjar-webhook" in args and not any(a.startswith("--webhook-secret") for a in args)
    assert {"name": "webhook-tls", "secret": {"secretName": "nightjar-operator-webhook-tls"}} in pod["volumes"]
    # cert-manager writes the Secret: the operator gets no right on Secrets or webhook configurations.
    assert not objs.of("Secret") and not [r for r in objs.of("Role") if r["metadata"]["name"].endswith("-webhook")]
    issuer = {"kind": "ClusterIssuer", "name": "corp-ca"}
    objs = render(helm, sets=["webhook.certificates=cert-manager", "webhook.certManager.issuerRef.kind=ClusterIssuer",
                              "webhook.certManager.issuerRef.name=corp-ca"])
    assert not objs.of("Issuer") and objs.one("Certificate")["spec"]["issuerRef"] == issuer


def test_webhook_disabled(helm):
    objs = render(helm, sets=["webhook.enabled=false"])
    assert not objs.of("ValidatingWebhookConfiguration")
    assert not [s for s in objs.of("Service") if s["metadata"]["name"].endswith("-webhook")]
    assert not any(a.startswith("--webhook") for a in objs.one("Deployment")["spec"]["template"]["spec"]["containers"][0]["args"])


def test_pod_policy_value_reaches_the_operator(helm):
    def env(objs) -> dict[str, str]:
        ctr = objs.one("Deployment")["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in ctr["env"]}

    assert ENV_EXTRA_VOLUME_TYPES not in env(render(helm))
    value = env(render(helm, sets=["operator.podPolicy.extraVolumeTypes={hostPath,serviceAccountToken}"]))
    assert value[ENV_EXTRA_VOLUME_TYPES] == "hostPath,serviceAccountToken"
    assert PodPolicy.parse(value[ENV_EXTRA_VOLUME_TYPES]).projected_sources() >= {"serviceAccountToken"}
    bad = run_helm(helm, "template", "x", str(CHART), "--set", "operator.podPolicy.extraVolumeTypes={host path}",
                   check=False)
    assert bad.returncode != 0 and "extraVolumeTypes" in bad.stderr, bad.stderr
