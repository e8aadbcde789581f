"""Trust boundaries on the real apiserver: no takeover by name, the admission webhook, the
aggregated roles. Reuses the session cluster and the helpers of test_operator_cluster.py."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml
from helpers import condition, cr, free_port, wait_for
from kopf.testing import KopfRunner
from nightjar_operator import constants as c
from nightjar_operator.handlers import sync as rec
from nightjar_operator.handlers import webhook
from nightjar_operator.handlers.k8s import Api, make_api_client
from nightjar_operator.handlers.settings import ENV_EXTRA_VOLUME_TYPES
from nightjar_operator.reconcile.admission import WEBHOOK_NAME, WEBHOOK_PATH
from test_operator_cluster import ROOT, RUN_ARGS, Cluster, assert_clean, delete_and_wait, sample

pytestmark = pytest.mark.cluster


@pytest.fixture
def cl(k8s, namespace, crd) -> Cluster:
    return Cluster(k8s, Api(make_api_client(k8s.kubeconfig)), namespace)


def _frozen(obj: dict[str, Any]) -> str:
    """Everything an overwrite would change, as one comparable string."""
    return json.dumps({k: v for k, v in obj.items() if k != "status"}, sort_keys=True)


def test_helm_owned_objects_of_the_same_name_are_never_taken_over(cl: Cluster):
    """A chart's Service and ConfigMap named as the operator would name its children stay
    byte-identical (no write at all: same resourceVersion), the NightjarDeployment is
    Degraded=Conflict naming each, no worker is created, and deleting it leaves them."""
    name = "victim"
    helm_meta = {"labels": {"app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/name": "victim"},
                 "annotations": {"meta.helm.sh/release-name": "victim", "meta.helm.sh/release-namespace": cl.ns}}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, **helm_meta},
           "spec": {"selector": {"app": "victim"}, "ports": [{"name": "web", "port": 9999, "targetPort": 9999}]}}
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": c.config_map_name(name), **helm_meta},
          "data": {"app.conf": "listen 9999\n"}}
    for obj in (svc, cm):
        cl.apply(obj)
    before = {k: _frozen(cl.child(k, n)) for k, n in (("Service", name), ("ConfigMap", c.config_map_name(name)))}
    conflicts0 = sample("nightjar_operator_child_conflicts_total", kind="Service")
    with KopfRunner(RUN_ARGS, timeout=60) as runner:
        cl.apply(cr(name, replicas=1))

        def degraded() -> dict[str, Any] | None:
            deg = condition(cl.njd(name), "Degraded")
            return deg if deg.get("reason") == "Conflict" else None

        deg = wait_for(degraded, 60, "Degraded=Conflict")
        assert deg["status"] == "True"
        assert f"Service {cl.ns}/{name} exists" in deg["message"], deg
        assert f"ConfigMap {cl.ns}/{name}-config exists" in deg["message"], deg
        assert condition(cl.njd(name), "Ready")["reason"] == "Conflict"
        time.sleep(2)  # a few more reconciles (child events, retries) would show any write
        assert cl.child("Deployment", name) is None  # nothing half-made: no pods behind someone else's Service
        after = {k: _frozen(cl.child(k, n)) for k, n in (("Service", name), ("ConfigMap", c.config_map_name(name)))}
        assert after == before
        assert sample("nightjar_operator_child_conflicts_total", kind="Service") > conflicts0
        delete_and_wait(cl, name)
    time.sleep(2)  # the garbage collector had its chance
    after = {k: _frozen(cl.child(k, n)) for k, n in (("Service", name), ("ConfigMap", c.config_map_name(name)))}
    assert after == before  # data, ports, labels, ownerReferences (none): untouched, still there
    assert_clean(runner.output)


def test_orphaned_children_are_adopted_back(cl: Cluster):
    """`delete --cascade=orphan` then the same name again: the children carry the operator's labels
    and its field manager, so the new NightjarDeployment adopts them (no Conflict)."""
    name = "orphan"
    with KopfRunner(RUN_ARGS, timeout=60) as runner:
        cl.apply(cr(name, replicas=1))
        old_uid = cl.wait_ready(name, replicas=1)["metadata"]["uid"]
        managers = {f["manager"] for f in cl.child("ConfigMap", c.config_map_name(name))["metadata"]["managedFields"]}
        assert c.FIELD_MANAGER in managers, managers
        cl.api.request("DELETE", cl.api.path(c.KIND, cl.ns, name), {"propagationPolicy": "Orphan"})
        wait_for(lambda: cl.njd(name) is None, 60, "the CR gone")
        wait_for(lambda: not cl.child("Service", name)["metadata"].get("ownerReferences"), 60, "children orphaned")
        cl.apply(cr(name, replicas=1))
        obj = cl.wait_ready(name, replicas=1)
        assert obj["metadata"]["uid"] != old_uid
        for kind, child in (("Deployment", name), ("Service", name), ("ConfigMap", c.config_map_name(name))):
            refs = cl.child(kind, child)["metadata"]["ownerReferences"]
            assert [r["uid"] for r in refs] == [obj["metadata"]["uid"]], kind
        assert condition(obj, "Degraded")["reason"] == "AsExpected"
        delete_and_wait(cl, name)
    assert_clean(runner.output)


@pytest.fixture
def admission(cl: Cluster):
    """A ValidatingWebhookConfiguration for this namespace only, pointing at two webhook servers
    ("replicas") on loopback that share one operator-managed certificate."""
    k8s, ns = cl.k8s, cl.ns
    k8s.kubectl("label", "namespace", ns, f"nightjar-webhook-test={ns}")
    vwc_name = f"nightjar-test-{ns}"
    ports = [free_port(), free_port()]

    def config(port: int) -> dict[str, Any]:
        return {"url": f"https://127.0.0.1:{port}{WEBHOOK_PATH}"}

    vwc = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
           "metadata": {"name": vwc_name},
           "webhooks": [{"name": WEBHOOK_NAME, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                         "failurePolicy": "Fail", "timeoutSeconds": 5, "clientConfig": config(ports[0]),
                         "namespaceSelector": {"matchLabels": {"nightjar-webhook-test": ns}},
                         "rules": [{"apiGroups": [c.GROUP], "apiVersions": [c.VERSION], "resources": [c.PLURAL],
                                    "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}]}]}
    k8s.kubectl("apply", "-f", "-", input=yaml.safe_dump(vwc))
    servers = []
    try:
        for port in ports:
            servers.append(webhook.start(webhook.WebhookSettings(
                port=port, addr="127.0.0.1", secret=f"{ns}/webhook-tls", configuration=vwc_name,
                hosts=("127.0.0.1",)), cl.api))

        def switch(i: int) -> None:  # as if the Service sent this review to replica i
            ops = [{"op": "replace", "path": "/webhooks/0/clientConfig/url", "value": config(ports[i])["url"]}]
            k8s.kubectl("patch", "validatingwebhookconfiguration", vwc_name, "--type=json", "-p", json.dumps(ops))

        yield vwc_name, switch
    finally:
        for s in servers:
            s.stop()
        k8s.kubectl("delete", "validatingwebhookconfiguration", vwc_name, "--ignore-not-found")


def test_webhook_refuses_invalid_specs_at_apply_time(cl: Cluster, admission, monkeypatch):
    vwc_name, switch = admission
    invalid0 = sample("nightjar_operator_admission_reviews_total", operation="CREATE", decision="invalid")
    vwc = json.loads(cl.k8s.kubectl("get", "validatingwebhookconfiguration", vwc_name, "-o", "json").stdout)
    secret = cl.api.request("GET", f"/api/v1/namespaces/{cl.ns}/secrets/webhook-tls")
    assert vwc["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]  # set by the operator

    def refused(obj: dict[str, Any], field: str) -> None:
        """kubectl shows the webhook's refusal as it shows the apiserver's own validation errors."""
        before = sample("nightjar_operator_admission_reviews_total", operation=op(obj), decision="invalid")
        proc = cl.apply(obj, check=False)
        assert proc.returncode != 0, proc.stdout
        assert f'The NightjarDeployment "{obj["metadata"]["name"]}" is invalid: ' in proc.stderr, proc.stderr
        assert field + ": " in proc.stderr, proc.stderr
        # (an UPDATE may be reviewed twice: the apiserver retries a failed update against fresh state)
        assert sample("nightjar_operator_admission_reviews_total", operation=op(obj), decision="invalid") > before

    def op(obj: dict[str, Any]) -> str:
        return "UPDATE" if cl.njd(obj["metadata"]["name"]) is not None else "CREATE"

    same_files = {"name": "draft-1", "source": {"imagePath": "/models/target-1"}}
    refused(cr("bad", draft=same_files), "spec.draft.source")
    refused(cr("bad", pod={"volumes": [{"name": "h", "hostPath": {"path": "/var/run"}}]}), "spec.pod.volumes[0].hostPath")
    refused(cr("bad", pod={"envFrom": [{"secretRef": {"name": "s"}}]}), "spec.pod.envFrom[0].prefix")
    assert cl.njd("bad") is None
    cl.apply(cr("good"))
    refused(cr("good", speculation={"maxGamma": 4, "arms": [0, 9]}), "spec.speculation.arms[1]")  # an update too

    # The other replica serves the same certificate: the same answers.
    switch(1)
    refused(cr("bad", draft=same_files), "spec.draft.source")
    assert not webhook.ensure_ca_bundle(cl.api, vwc_name, webhook.ensure_material(
        cl.api, f"{cl.ns}/webhook-tls", ("127.0.0.1",)).ca)  # nothing to change: one shared CA

    # A spec that became invalid later (here: the admin narrowed the volume policy) is still
    # reported in status by the reconcile; metadata-only writes and the deletion go through.
    monkeypatch.setenv(ENV_EXTRA_VOLUME_TYPES, "hostPath")
    cl.apply(cr("later", replicas=1, pod={"volumes": [{"name": "h", "hostPath": {"path": "/data"}}]}))
    monkeypatch.delenv(ENV_EXTRA_VOLUME_TYPES)
    rec.reconcile(cl.api, cl.njd("later"), trigger="test")
    ready = condition(cl.njd("later"), "Ready")
    assert ready["reason"] == "InvalidSpec" and "spec.pod.volumes[0].hostPath" in ready["message"], ready
    cl.k8s.kubectl("label", "njd", "later", "-n", cl.ns, "team=search")
    cl.k8s.kubectl("annotate", "njd", "later", "-n", cl.ns, "example.org/note=x")
    refused(cr("later", replicas=2, pod={"volumes": [{"name": "h", "hostPath": {"path": "/data"}}]}),
            "spec.pod.volumes[0].hostPath")
    cl.k8s.kubectl("delete", "njd", "later", "-n", cl.ns, "--wait=true", timeout=60)
    assert sample("nightjar_operator_admission_reviews_total", operation="CREATE", decision="invalid") - invalid0 == 4


def test_aggregated_roles_let_namespace_users_use_nightjar(cl: Cluster):
    """The chart's nightjar-view / nightjar-edit (as manifests/rbac renders them) reach the built-in
    roles through the controller-manager's aggregation: a namespace `edit` user may create and scale
    NightjarDeployments, a `view` user only read them, and neither elsewhere nor their status."""
    k8s, ns = cl.k8s, cl.ns
    roles = list(yaml.safe_load_all((ROOT / "manifests/rbac/aggregated_roles.yaml").read_text()))
    assert {r["metadata"]["name"] for r in roles} == {"nightjar-view", "nightjar-edit"}
    k8s.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(roles))
    k8s.kubectl("create", "rolebinding", "alice-edit", "--clusterrole=edit", "--user=alice", "-n", ns)
    k8s.kubectl("create", "rolebinding", "bob-view", "--clusterrole=view", "--user=bob", "-n", ns)

    def can(user: str, *args: str) -> bool:
        out = k8s.kubectl("auth", "can-i", *args, "--as", user, check=False).stdout.strip()
        return out == "yes"

    wait_for(lambda: can("alice", "create", "nightjardeployments.nightjar.dev", "-n", ns), 30,
             "edit to aggregate nightjar-edit")  # fmt: skip
    assert can("alice", "patch", "nightjardeployments.nightjar.dev", "--subresource=scale", "-n", ns)
    assert can("alice", "delete", "nightjardeployments.nightjar.dev", "-n", ns)
    assert not can("alice", "patch", "nightjardeployments.nightjar.dev", "--subresource=status", "-n", ns)
    assert not can("alice", "create", "nightjardeployments.nightjar.dev", "-n", "default")
    assert can("bob", "list", "nightjardeployments.nightjar.dev", "-n", ns)
    assert not can("bob", "create", "nightjardeployments.nightjar.dev", "-n", ns)
    # And for real, as alice: apply, scale; bob reads it.
    k8s.kubectl("apply", "-n", ns, "--as", "alice", "-f", "-", input=yaml.safe_dump(cr("mine", replicas=1)))
    k8s.kubectl("scale", "njd", "mine", "-n", ns, "--replicas=2", "--as", "alice")
    assert json.loads(k8s.kubectl("get", "njd", "mine", "-n", ns, "-o", "json", "--as", "bob").stdout)["spec"]["replicas"] == 2
