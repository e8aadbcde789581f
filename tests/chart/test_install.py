"""`helm install --wait` into the real loopback kube-apiserver, the operator running under the
chart's ServiceAccount token with the chart's command line, a sample NightjarDeployment reconciled
without a 403 (its NetworkPolicy with the chart's peers accepted by the apiserver), the operator's
metrics scraped by a real Prometheus, and `helm uninstall` with the NightjarDeployment still there:
the pre-delete hook's script, run with the hook's ServiceAccount, deletes it while the operator
still runs, and nothing is left behind.

Containers never run in the test cluster (the node agent only reports pods Running/Ready): the
operator pod the chart creates becomes Ready there, and the operator itself runs as a local process
with that pod's ServiceAccount token and arguments.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from helmutil import CHART, ROOT, run_helm
from helpers import free_port, wait_for

pytestmark = [pytest.mark.helm, pytest.mark.cluster]

CRD = "nightjardeployments.nightjar.dev"
OBS = ROOT / "tests" / "observability"






def _json(k8s, *args: str, kubeconfig: str | None = None) -> dict | None:
    p = k8s.kubectl(*args, "-o", "json", check=False, **({"kubeconfig": kubeconfig} if kubeconfig else {}))
    return json.loads(p.stdout) if p.returncode == 0 else None


def _adopt_existing_crd(k8s, release: str, namespace: str) -> None:
    """Other tests may have applied the CRD with kubectl; let this release adopt it (Helm's documented way)."""
    if k8s.kubectl("get", "crd", CRD, check=False).returncode != 0:
        return
    k8s.kubectl("annotate", "crd", CRD, f"meta.helm.sh/release-name={release}",
                f"meta.helm.sh/release-namespace={namespace}", "--overwrite")
    k8s.kubectl("label", "crd", CRD, "app.kubernetes.io/managed-by=Helm", "--overwrite")


def _leftovers(k8s, namespace: str, release: str) -> list[str]:
    sel = f"app.kubernetes.io/instance={release}"
    out = k8s.kubectl("get", "deployments,replicasets,pods,services,configmaps,serviceaccounts,rolebindings,roles",
                      "-n", namespace, "-l", sel, "-o", "name").stdout.split()
    out += k8s.kubectl("get", "clusterroles,clusterrolebindings", "-l", sel, "-o", "name").stdout.split()
    return out


def _stop(op: subprocess.Popen) -> None:
    op.terminate()
    try:
        op.wait(15)
    except subprocess.TimeoutExpired:
        op.kill()
        op.wait(5)


def _uninstall_through_the_hook(helm, k8s, release: str, namespace: str, env: dict, op: subprocess.Popen) -> float:
    """`helm uninstall` with a NightjarDeployment present. The test node runs no containers, so the
    hook Job's pod is played here: its command, with its ServiceAccount's token, then the pod's
    success reported as a kubelet would. Returns the uninstall's seconds."""
    t0 = time.monotonic()
    proc = subprocess.Popen([helm, "uninstall", release, "-n", namespace, "--wait", "--timeout", "120s"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def hook_pod() -> dict | None:
            pods = (_json(k8s, "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=uninstall") or {})
            return next(iter(pods.get("items") or []), None)

        pod = wait_for(hook_pod, 60, "the pre-delete hook's pod", 0.5)
        ctr = pod["spec"]["containers"][0]
        kubeconfig = k8s.serviceaccount_kubeconfig(namespace, pod["spec"]["serviceAccountName"])
        run = subprocess.run([sys.executable, *ctr["command"][1:], *ctr["args"]], capture_output=True, text=True,
                             timeout=120, env={**env, "KUBECONFIG": kubeconfig})
        assert run.returncode == 0, run.stdout + run.stderr
        assert "deleting 1 NightjarDeployment(s): " + f"{namespace}/demo" in run.stdout, run.stdout
        assert "all NightjarDeployments gone" in run.stdout, run.stdout
        _stop(op)  # as Helm is about to delete its pod (and its ServiceAccount: no 403 in its log)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {"status": {"phase": "Succeeded", "containerStatuses": [{
            "name": ctr["name"], "image": ctr["image"], "imageID": "", "ready": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}}]}}
        k8s.kubectl("patch", "pod", pod["metadata"]["name"], "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps(status), check=False)
        out, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    return time.monotonic() - t0


def test_install_reconcile_under_chart_sa_uninstall(helm, k8s, namespace, tmp_path):
    release = f"nj{namespace[-6:]}"  # cluster-scoped names (ClusterRoles) stay unique per run
    metrics_port, health_port, webhook_port = free_port(), free_port(), free_port()
    env = k8s.env
    _adopt_existing_crd(k8s, release, namespace)
    values = {
        "fullnameOverride": release,
        "operator": {"watchNamespaces": [namespace], "metricsPort": metrics_port, "healthPort": health_port,
                     "extraArgs": ["--webhook-host=127.0.0.1"]},  # the webhook reached on loopback, below
        "webhook": {"port": webhook_port},
        "tests": {"workerService": "demo"},
    }
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    t0 = time.monotonic()
    out = run_helm(helm, "install", release, str(CHART), "-n", namespace, "-f", str(tmp_path / "values.yaml"),
                   "--wait", "--timeout", "120s", env=env, timeout=180).stdout
    install_s = time.monotonic() - t0
    assert "STATUS: deployed" in out
    assert f"It watches NightjarDeployments in: {namespace}." in out  # NOTES.txt rendered
    assert "monitoring.coreos.com/v1 is not served here" in out
    # NOTES commands that run as written: no `port-forward ... && curl` (port-forward never exits).
    notes = out.split("NOTES:", 1)[1]
    assert "port-forward" in notes and not any("port-forward" in ln and "&&" in ln for ln in notes.splitlines())
    assert "manifests/samples/cpu-demo.yaml" in notes and "njd/cpu-demo" in notes and "pre-delete hook" in notes
    try:
        dep = _json(k8s, "get", "deployment", f"{release}-operator", "-n", namespace)
        assert dep["status"].get("readyReplicas") == 2  # an operating replica and a standby
        crd = _json(k8s, "get", "crd", CRD)
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}["Established"] == "True"
        sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
        kubeconfig = k8s.serviceaccount_kubeconfig(namespace, sa)

        # Least privilege, asked of the real authorizer with the chart's token.
        def can(*args: str) -> bool:
            return k8s.kubectl("auth", "can-i", *args, kubeconfig=kubeconfig, check=False).stdout.strip() == "yes"

        assert can("watch", "nightjardeployments.nightjar.dev", "-n", namespace)
        assert can("create", "deployments.apps", "-n", namespace)
        assert not can("get", "secrets", "-n", namespace)
        assert not can("create", "pods", "-n", namespace)
        assert not can("delete", "customresourcedefinitions")
        assert not can("create", "deployments.apps", "-n", "default"), "namespaced install must not reach other namespaces"
        assert can("update", f"leases.coordination.k8s.io/{release}-operator", "-n", namespace)
        assert not can("update", "leases.coordination.k8s.io/other", "-n", namespace)
        assert can("update", f"secrets/{release}-operator-webhook-tls", "-n", namespace)  # that one only
        assert can("patch", f"validatingwebhookconfigurations.admissionregistration.k8s.io/{release}-operator")
        assert not can("patch", "validatingwebhookconfigurations.admissionregistration.k8s.io/other")
        # The test apiserver cannot reach a Service's ClusterIP (no kube-proxy on this node): the
        # chart's webhook configuration is pointed at the operator process on loopback instead.
        k8s.kubectl("patch", "validatingwebhookconfiguration", f"{release}-operator", "--type=json", "-p", json.dumps([
            {"op": "remove", "path": "/webhooks/0/clientConfig/service"},
            {"op": "add", "path": "/webhooks/0/clientConfig/url",
             "value": f"https://127.0.0.1:{webhook_port}/validate-nightjardeployments"}]))

        # The operator, started exactly as the chart's Deployment starts it, with its token.
        c = dep["spec"]["template"]["spec"]["containers"][0]
        assert c["command"] == ["nightjar-operator"]
        exe = str(Path(sys.executable).parent / "nightjar-operator")
        log = tmp_path / "operator.log"
        # Resync every 2 s so that reconciles keep happening while Prometheus watches (default 60 s).
        # POD_NAMESPACE as the Deployment's downward API sets it: the Lease lives there.
        chart_env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
        op_env = {**env, **chart_env, "KUBECONFIG": kubeconfig, "NIGHTJAR_OPERATOR_RESYNC_SECONDS": "2",
                  "POD_NAMESPACE": namespace}
        op_env.pop("KUBERNETES_SERVICE_HOST", None)
        op = subprocess.Popen([exe, *c["args"]], env=op_env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
        try:
            sample = yaml.safe_load((ROOT / "manifests/samples/cpu-demo.yaml").read_text())
            sample["metadata"] = {"name": "demo", "namespace": namespace}
            gateway = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}}
            sample["spec"]["networkPolicy"] = {"enabled": True, "from": [gateway]}
            # The webhook answers once the operator filled the chart's Secret and set the caBundle.
            wait_for(lambda: k8s.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(sample),
                                         check=False).returncode == 0, 60, "the admission webhook", 0.5, proc=op, log=log)
            k8s.kubectl("apply", "-f", "-", input=yaml.safe_dump(sample))
            bad = {**sample, "metadata": {"name": "bad", "namespace": namespace},
                   "spec": {**sample["spec"], "pod": {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}}}
            refused = k8s.kubectl("apply", "-f", "-", input=yaml.safe_dump(bad), check=False)
            assert refused.returncode != 0 and "spec.pod.volumes[0].hostPath" in refused.stderr, refused.stderr

            def reconciled():
                njd = _json(k8s, "get", "njd", "demo", "-n", namespace)
                st = (njd or {}).get("status") or {}
                return st.get("observedGeneration") == njd["metadata"]["generation"] and st.get("conditions")

            wait_for(reconciled, 60, "the sample's status", 0.5, proc=op, log=log)
            for kind in ("deployment", "service", "configmap"):
                name = "demo-config" if kind == "configmap" else "demo"
                child = _json(k8s, "get", kind, name, "-n", namespace)
                assert child and child["metadata"]["ownerReferences"][0]["name"] == "demo", kind
            assert httpx.get(f"http://127.0.0.1:{health_port}/healthz", timeout=5, trust_env=False).status_code == 200
            # spec.networkPolicy: accepted by the apiserver (1.20 here enforces none), admitting the
            # operator's pods as the chart renders them and the spec's gateway, on the worker port only.
            policy = _json(k8s, "get", "networkpolicy", "demo", "-n", namespace)
            assert policy and policy["metadata"]["ownerReferences"][0]["name"] == "demo"
            assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8000}], "from": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                 "podSelector": {"matchLabels": dep["spec"]["selector"]["matchLabels"]}}, gateway]}]

            # A real Prometheus scrapes the operator the way the chart's ServiceMonitor does.
            sys.path.insert(0, str(OBS))
            from promutil import Prometheus, has_data, panel_queries  # noqa: PLC0415

            prom = Prometheus(tmp_path / "prom", [{
                "job_name": f"{release}-operator-metrics", "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"], "labels": {"namespace": namespace}}],
            }], sorted((CHART / "rules").glob("*.yaml")))
            try:
                # Several scrapes spanning resync reconciles, so rates and quantiles have data.
                wait_for(lambda: prom.query('count_over_time(nightjar_operator_status_writes_total[1m]) >= 6')["result"], 60,
                         "Prometheus to scrape the operator")
                wait_for(lambda: prom.query('increase(nightjar_operator_reconciles_total{trigger="resync"}[1m]) > 0')["result"],
                         30, "resync reconciles seen by Prometheus")
                results = {title: has_data(prom.query(e)) for title, e in panel_queries()
                           if "nightjar_operator_" in e}
                # No reconcile error happened (no 403 above all), so that panel is rightly empty.
                assert results.pop("Reconcile errors / s by reason") is False
                assert results and all(results.values()), results
                assert not prom.query('ALERTS{alertname=~"NightjarOperator.*"}')["result"]
            finally:
                prom.stop()

            uninstall_s = _uninstall_through_the_hook(helm, k8s, release, namespace, env, op)
            assert _json(k8s, "get", "njd", "demo", "-n", namespace) is None
        finally:
            if op.poll() is None:
                _stop(op)
        out = log.read_text()
        # Every apiserver 403 says "forbidden" (kopf: APIForbiddenError); a bare "403" also matches
        # timestamps' milliseconds, so it is not searched for.
        denied = [ln for ln in out.splitlines() if "forbidden" in ln.lower()]
        assert not denied, "\n".join(denied[:5])
        assert "Traceback" not in out, out[-3000:]
    finally:  # after a failure above: uninstall without the hook (its Job would wait for a kubelet)
        if run_helm(helm, "list", "-n", namespace, "-q", env=env).stdout.strip():
            run_helm(helm, "uninstall", release, "-n", namespace, "--no-hooks", "--wait", "--timeout", "60s", env=env,
                     check=False)
    # Nothing of the release is left; the CRD stays on purpose (resource-policy: keep).
    wait_for(lambda: not _leftovers(k8s, namespace, release), 30, "the release's objects to go")
    assert run_helm(helm, "list", "-n", namespace, "-q", env=env).stdout.strip() == ""
    assert k8s.kubectl("get", "crd", CRD, check=False).returncode == 0
    print(f"helm install --wait {install_s:.1f}s, uninstall {uninstall_s:.1f}s")


SAMPLES = sorted((ROOT / "manifests/samples").glob("*.yaml"))


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_sample_is_accepted_by_the_apiserver(k8s, crd, namespace, sample):
    """Every sample as written, the GPU one too, against the checked-in CRD on the real apiserver
    (server-side dry run: nothing is created). The CPU ones reach Ready on the real kubelet in
    tests/e2e; without spec.image (no default worker image) the apiserver refuses naming it."""
    k8s.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(sample))
    doc = yaml.safe_load(sample.read_text())
    del doc["spec"]["image"]
    p = k8s.kubectl("apply", "--dry-run=server", "--validate=false", "-n", namespace, "-f", "-",
                    input=yaml.safe_dump(doc), check=False)  # the apiserver's word, not kubectl's
    assert p.returncode != 0 and "spec.image" in p.stderr, p.stderr
