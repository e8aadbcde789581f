"""The chart rendered by the real helm: lint, several values files, schema errors, security, gates,
and the checked-in copies (CRD, dashboards, manifests/) that must match their sources."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from helmutil import CHART, INVALID_DIR, ROOT, render, run_helm, values_files

pytestmark = pytest.mark.helm

MONITORING = "monitoring.coreos.com/v1"
VALUES = values_files()


@pytest.mark.parametrize("values", VALUES, ids=[v.stem for v in VALUES])
def test_lint_strict(helm, values):
    out = run_helm(helm, "lint", "--strict", str(CHART), "-f", str(values)).stdout
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("values", VALUES, ids=[v.stem for v in VALUES])
def test_pods_non_root_read_only(helm, values):
    objs = render(helm, [values], api_versions=[MONITORING])
    pod_specs = [d["spec"]["template"]["spec"] for d in objs.of("Deployment") + objs.of("Job")] + [
        p["spec"] for p in objs.of("Pod")]
    assert pod_specs, "nothing with a pod spec rendered"
    for spec in pod_specs:
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"].get("runAsUser", 1) != 0
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], c["name"]


def test_defaults_render_expected_objects(helm):
    objs = render(helm)
    assert objs.kinds() == sorted([
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "Deployment", "ConfigMap",
        "CustomResourceDefinition", "Pod", "Role", "RoleBinding",
        # the pre-delete hook (uninstall-hook.yaml)
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job",
        # aggregated-roles.yaml: <release>-view, <release>-edit
        "ClusterRole", "ClusterRole",
        # webhook.yaml (certificates: operator): its Service, configuration, Secret and RBAC
        "Service", "ValidatingWebhookConfiguration", "Secret", "Role", "RoleBinding", "ClusterRole",
        "ClusterRoleBinding",
    ])
    dep = objs.one("Deployment", "nightjar-operator")
    spec = dep["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "nightjar-operator"
    c = spec["containers"][0]
    assert c["command"] == ["nightjar-operator"]
    # All namespaces by default: no --namespace flag; metrics and liveness on the declared ports.
    assert c["args"] == ["run", "--metrics-port=8080", "--liveness=http://0.0.0.0:8081/healthz", "--leader-elect",
                         "--lease-name=nightjar-operator", "--lease-duration=15", "--renew-deadline=10",
                         "--retry-period=2", "--webhook-port=9443",
                         "--webhook-secret=nightjar-system/nightjar-operator-webhook-tls",
                         "--webhook-configuration=nightjar-operator",
                         "--webhook-host=nightjar-operator-webhook.nightjar-system.svc",
                         "--webhook-host=nightjar-operator-webhook.nightjar-system.svc.cluster.local"]
    # Two replicas, one operating: a rolling update never leaves none.
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    role = objs.one("Role", "nightjar-operator-leader-election")
    assert role["metadata"]["namespace"] == "nightjar-system"
    assert {v for r in role["rules"] for v in r["verbs"]} == {"create", "get", "update"}
    assert objs.one("RoleBinding", role["metadata"]["name"])["roleRef"]["name"] == role["metadata"]["name"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 8080, "health": 8081, "webhook": 9443}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    svc = objs.one("Service", "nightjar-operator-metrics")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    # All namespaces: the one role bound cluster-wide to the chart's ServiceAccount.
    crb = objs.one("ClusterRoleBinding", "nightjar-operator")
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": "nightjar-operator", "namespace": "nightjar-system"}]
    assert crb["roleRef"]["name"] == objs.one("ClusterRole", "nightjar-operator")["metadata"]["name"]


def test_rbac_is_least_privilege(helm):
    objs = render(helm)
    rules = [r for cr in objs.of("ClusterRole") for r in cr["rules"]]
    allowed = {(g, res, v) for r in rules for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]}
    assert not any("*" in t for t in allowed), "no wildcards"
    # What the operator needs ...
    for need in [("nightjar.dev", "nightjardeployments", "watch"), ("nightjar.dev", "nightjardeployments/status", "patch"),
                 ("nightjar.dev", "nightjardeployments/finalizers", "update"),
                 ("apps", "deployments", "create"), ("", "services", "update"), ("", "configmaps", "create"),
                 ("", "pods", "list"), ("", "events", "create"),
                 ("apiextensions.k8s.io", "customresourcedefinitions", "list")]:
        assert need in allowed, need
    # ... and nothing it does not: no secrets, no pod writes, no CRD writes, no RBAC, no exec.
    for resource in ("secrets", "pods/exec", "clusterroles", "rolebindings", "nodes", "namespaces"):
        assert not any(res == resource for _, res, _ in allowed), resource
    assert not any(res == "pods" and v not in ("get", "list", "watch") for _, res, v in allowed)
    assert not any(res == "customresourcedefinitions" and v not in ("get", "list", "watch") for _, res, v in allowed)


@pytest.mark.parametrize(("value", "group", "resource"), [
    ("operator.autoscaling.hpa", "autoscaling", "horizontalpodautoscalers"),
    ("operator.autoscaling.keda", "keda.sh", "scaledobjects"),
    ("operator.routing.gatewayApi", "gateway.networking.k8s.io", "httproutes"),
    ("operator.routing.inferencePool", "inference.networking.k8s.io", "inferencepools"),
])  # fmt: skip
def test_optional_kinds_gated_by_values(helm, value, group, resource):
    def granted(objs) -> set[str]:
        return {v for cr in objs.of("ClusterRole") for r in cr["rules"] if group in r["apiGroups"]
                and resource in r["resources"] for v in r["verbs"]}  # fmt: skip

    assert granted(render(helm)) == {"get", "create", "update", "delete"}
    assert granted(render(helm, sets=[f"{value}=false"])) == set()


def test_namespaced_values(helm):
    objs = render(helm, [ROOT / "tests/chart/values/namespaced.yaml"])
    assert "CustomResourceDefinition" not in objs.kinds()
    args = objs.one("Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["run", "--namespace=team-a", "--namespace=team-b"]
    assert "--verbose" in args and "--some-flag" in args
    rbs = [rb for rb in objs.of("RoleBinding") if rb["roleRef"]["kind"] == "ClusterRole"
           and rb["roleRef"]["name"] == "nightjar-operator"]
    assert sorted(rb["metadata"]["namespace"] for rb in rbs) == ["team-a", "team-b"]
    assert all(rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "nightjar-operator"}
               for rb in rbs)
    # Only the cluster-scoped CRD read stays bound cluster-wide.
    assert [crb["roleRef"]["name"] for crb in objs.of("ClusterRoleBinding")] == [
        "nightjar-operator-cluster", "nightjar-operator-webhook"]  # + the webhook's one configuration
    # The uninstall hook may delete NightjarDeployments in the watched namespaces only.
    hook_rbs = [rb for rb in objs.of("RoleBinding") if rb["roleRef"]["name"] == "nightjar-uninstall"]
    assert sorted(rb["metadata"]["namespace"] for rb in hook_rbs) == ["team-a", "team-b"]
    assert objs.one("Job")["spec"]["template"]["spec"]["containers"][0]["args"] == ["300", "team-a", "team-b"]
    cluster_rules = objs.one("ClusterRole", "nightjar-operator-cluster")["rules"]
    assert cluster_rules == [
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
    ]
    ns_rules = objs.one("ClusterRole", "nightjar-operator")["rules"]
    assert ns_rules + cluster_rules[:1] == render(helm).one("ClusterRole", "nightjar-operator")["rules"]
    test_pod = objs.one("Pod")
    assert test_pod["spec"]["containers"][0]["args"][0] == "http://llama-70b.team-a.svc:8000/v1/models"


def test_hardened_values(helm):
    objs = render(helm, [ROOT / "tests/chart/values/hardened.yaml"])
    # The pre-provisioned identity: no ServiceAccount but the uninstall hook's own (short-lived) one.
    assert [sa["metadata"]["name"] for sa in objs.of("ServiceAccount")] == ["njd-ctrl-uninstall"]
    assert "Pod" not in objs.kinds() and "ConfigMap" not in objs.kinds()
    assert not [svc for svc in objs.of("Service") if svc["metadata"]["name"].endswith("-metrics")]
    spec = objs.one("Deployment", "njd-ctrl-operator")["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "nightjar-preprovisioned"
    assert spec["containers"][0]["image"] == (
        "registry.example.com/nightjar/operator@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["securityContext"]["runAsUser"] == 10001
    for crb in objs.of("ClusterRoleBinding"):
        if crb["metadata"]["name"] != "njd-ctrl-uninstall":  # the hook's own identity
            assert crb["subjects"][0]["name"] == "nightjar-preprovisioned"


def test_monitoring_objects_gated_on_api(helm):
    plain = render(helm)
    assert not {"ServiceMonitor", "PodMonitor", "PrometheusRule"} & set(plain.kinds())
    objs = render(helm, [ROOT / "tests/chart/values/monitoring.yaml"], api_versions=[MONITORING])
    sm = objs.one("ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics" and sm["spec"]["endpoints"][0]["interval"] == "15s"
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True
    pm = objs.one("PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "nightjar-worker", "app.kubernetes.io/managed-by": "nightjar-operator"}
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["serving"]}
    ep = pm["spec"]["podMetricsEndpoints"][0]
    assert ep["port"] == "http" and ep["path"] == "/metrics"
    assert {"sourceLabels": ["__meta_kubernetes_pod_label_nightjar_dev_deployment"], "targetLabel": "nightjar_deployment"} in ep["relabelings"]
    # vLLM's names restored after OpenMetrics escaping, exactly as the observability tests' Prometheus does.
    sys.path.insert(0, str(ROOT / "tests/observability"))
    from promutil import WORKER_METRIC_RELABEL

    as_prom = [{"source_labels": r["sourceLabels"], "regex": r["regex"], "target_label": r["targetLabel"],
                "replacement": r["replacement"]} for r in ep["metricRelabelings"]]
    assert as_prom == WORKER_METRIC_RELABEL
    # The PrometheusRule carries the rule files' groups unchanged.
    rule = objs.one("PrometheusRule")
    files = sorted((CHART / "rules").glob("*.yaml"))
    expected = [g for f in files for g in yaml.safe_load(f.read_text())["groups"]]
    assert rule["spec"]["groups"] == expected
    # Each monitor can be switched off.
    off = render(helm, sets=["metrics.podMonitor.enabled=false", "metrics.prometheusRule.enabled=false"],
                 api_versions=[MONITORING])
    assert "PodMonitor" not in off.kinds() and "PrometheusRule" not in off.kinds() and "ServiceMonitor" in off.kinds()
    # One setting labels all three for kube-prometheus-stack's selectors; per-object labels add to it.
    kps = render(helm, sets=["metrics.labels.release=kps", "metrics.podMonitor.labels.extra=yes"], api_versions=[MONITORING])
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
        assert kps.one(kind)["metadata"]["labels"]["release"] == "kps", kind
    assert kps.one("PodMonitor")["metadata"]["labels"]["extra"] == "yes"


def test_dashboard_configmaps(helm):
    objs = render(helm, [ROOT / "tests/chart/values/monitoring.yaml"])
    cms = objs.of("ConfigMap")
    files = sorted((CHART / "dashboards").glob("*.json"))
    assert len(cms) == len(files) >= 1
    for f in files:
        cm = next(c for c in cms if f.name in c["data"])
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == "monitoring"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "Nightjar"}
        assert json.loads(cm["data"][f.name]) == json.loads(f.read_text())


def test_crd_template(helm):
    src = yaml.safe_load((ROOT / "manifests/crds/nightjar.dev_nightjardeployments.yaml").read_text())
    crd = render(helm).one("CustomResourceDefinition")
    assert crd["spec"] == src["spec"], "the chart's CRD must be `make crds`'s output"
    assert crd["metadata"]["name"] == src["metadata"]["name"]
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    crd = render(helm, sets=["crds.keep=false"]).one("CustomResourceDefinition")
    assert "helm.sh/resource-policy" not in (crd["metadata"].get("annotations") or {})


def test_chart_crds_are_make_crds_output():
    """files/crds/ links to manifests/crds/ (one source, nothing to drift)."""
    src = sorted((ROOT / "manifests/crds").glob("*.yaml"))
    links = sorted((CHART / "files/crds").glob("*.yaml"))
    assert [p.name for p in links] == [p.name for p in src], "run `make chart-crds`"
    for a, b in zip(src, links, strict=True):
        assert b.is_symlink() and b.resolve() == a.resolve(), f"{b} must link to {a}: run `make chart-crds`"


def test_helm_test_hook(helm):
    pod = render(helm).one("Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    c = pod["spec"]["containers"][0]
    assert c["args"] == ["http://cpu-demo.nightjar-system.svc:8000/v1/models", "30"]  # the NOTES' sample
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("bad", sorted(INVALID_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_schema_rejects_bad_values(helm, bad):
    expect = bad.read_text().splitlines()[0].removeprefix("# expect:").strip()
    p = run_helm(helm, "template", "x", str(CHART), "-f", str(bad), check=False)
    assert p.returncode != 0, f"{bad.name} was accepted"
    assert expect in p.stderr, p.stderr


def test_dashboards_up_to_date():
    p = subprocess.run([sys.executable, str(ROOT / "scripts/prometheus/dashboard.py"), "--check"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_chart_readme_up_to_date():
    """charts/nightjar/README.md is generated from values.yaml: a value added without regenerating fails."""
    p = subprocess.run([sys.executable, str(ROOT / "scripts/chart/readme.py"), "--check"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    readme = (ROOT / "charts/nightjar/README.md").read_text()
    assert "| metrics.labels | object | `{}` | Labels on every ServiceMonitor" in readme


def test_manifests_match_chart(helm, tmp_path):
    """manifests/ (except crds/ and samples/, owned by the operator) is `make manifests-render` output."""
    p = subprocess.run(["make", "-s", "manifests-render", f"MANIFESTS_DIR={tmp_path}", f"HELM={helm}"],
                       cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rendered = sorted(f.relative_to(tmp_path) for f in tmp_path.rglob("*.yaml"))
    assert rendered, "nothing rendered"
    for rel in rendered:
        checked_in = ROOT / "manifests" / rel
        assert checked_in.exists(), f"manifests/{rel} missing: run `make manifests`"
        assert checked_in.read_text() == (tmp_path / rel).read_text(), f"manifests/{rel} is stale: run `make manifests`"
    # The plain RBAC (manifests/rbac/, used by the operator's own least-privilege test) is the chart's.
    role = yaml.safe_load((ROOT / "manifests/rbac/cluster_role.yaml").read_text())
    assert role["rules"] == render(helm).one("ClusterRole", "nightjar-operator")["rules"]


def test_gpu_sample_is_valid():
    """manifests/samples/gpu-pair.yaml passes the CRD's models and the operator's semantic checks."""
    from nightjar_operator.reconcile.validate import parse_spec, semantic_errors

    doc = yaml.safe_load((ROOT / "manifests/samples/gpu-pair.yaml").read_text())
    assert doc["kind"] == "NightjarDeployment" and doc["apiVersion"] == "nightjar.dev/v1alpha1"
    spec, errors = parse_spec(doc["spec"])
    assert not errors and not semantic_errors(spec, doc["metadata"]["name"])
    assert spec.resources.gpus == 1 and spec.target.source.uri and spec.draft.source.uri


def test_uninstall_hook(helm):
    """A pre-delete hook Job, with its own ServiceAccount that may only list, watch and delete
    NightjarDeployments, deletes them and waits while the operator still runs; every hook object
    goes once it succeeded. uninstall.deleteNightjarDeployments=false renders none of it."""
    objs = render(helm)
    hooks = [o for o in objs if (o["metadata"].get("annotations") or {}).get("helm.sh/hook") == "pre-delete"]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in hooks) == [
        ("ClusterRole", "nightjar-uninstall"), ("ClusterRoleBinding", "nightjar-uninstall"), ("Job", "nightjar-uninstall"),
        ("ServiceAccount", "nightjar-uninstall")]
    for o in hooks:
        policy = o["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
        assert policy == "before-hook-creation,hook-succeeded", o["kind"]
    weights = {o["kind"]: int(o["metadata"]["annotations"]["helm.sh/hook-weight"]) for o in hooks}
    assert weights["Job"] > max(w for k, w in weights.items() if k != "Job")  # its identity exists first
    assert objs.one("ClusterRole", "nightjar-uninstall")["rules"] == [
        {"apiGroups": ["nightjar.dev"], "resources": ["nightjardeployments"], "verbs": ["get", "list", "watch", "delete"]}]
    crb = objs.one("ClusterRoleBinding", "nightjar-uninstall")
    assert crb["subjects"] == [{"kind": "ServiceAccount", "name": "nightjar-uninstall", "namespace": "nightjar-system"}]
    job = objs.one("Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "nightjar-uninstall" and pod["restartPolicy"] == "Never"
    c = pod["containers"][0]
    assert c["image"] == objs.one("Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert c["command"][:2] == ["python3", "-c"] and c["args"] == ["300"]  # all namespaces
    assert job["spec"]["activeDeadlineSeconds"] == 360
    off = render(helm, sets=["uninstall.deleteNightjarDeployments=false"])
    assert not [o for o in off if "uninstall" in o["metadata"]["name"]]


def test_network_policy_peers_reach_the_operator(helm):
    """The operator's env lists the peers every spec.networkPolicy admits: its own pods (the fleet
    loop scrapes /metrics), then networkPolicy.extraFrom; it may manage NetworkPolicies."""
    prom = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    objs = render(helm, extra=["--set-json", f"networkPolicy.extraFrom=[{json.dumps(prom)}]"])
    dep = objs.one("Deployment")
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    peers = json.loads(env["NIGHTJAR_NETWORK_POLICY_PEERS"])
    assert peers == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "nightjar-system"}},
                      "podSelector": {"matchLabels": dep["spec"]["selector"]["matchLabels"]}}, prom]
    rules = objs.one("ClusterRole", "nightjar-operator")["rules"]
    assert {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
            "verbs": ["get", "create", "update", "delete"]} in rules


@pytest.mark.parametrize("sample", sorted((ROOT / "manifests/samples").glob("*.yaml")), ids=lambda p: p.stem)
def test_samples_pass_the_operators_checks(sample):
    """Every sample (the GPU one too) passes the CRD's models and the operator's semantic checks, names
    a worker image, and needs no PVC that nothing fills."""
    from nightjar_operator.reconcile.validate import parse_spec, semantic_errors

    doc = yaml.safe_load(sample.read_text())
    spec, errors = parse_spec(doc["spec"])
    assert not errors and not semantic_errors(spec, doc["metadata"]["name"]), errors
    assert spec.target.source.pvc is None and spec.draft.source.pvc is None
    if spec.resources.gpus == 0:  # a CPU sample names the CPU build
        assert spec.image.endswith("-cpu"), spec.image
