"""The user's journey on a real kubelet, in the order a platform engineer lives it (docs/install.md
runs the same commands):

1. ``helm install`` the chart (local images) -> the operator pods Running under the chart's ServiceAccount;
2. ``kubectl apply`` the samples as written: smollm2-oci.yaml (API key from a Secret, NetworkPolicy)
   and, in the release namespace as the chart's NOTES say, cpu-demo.yaml -> both worker pods Ready,
   and cpu-demo answers what ``helm test`` asks (then deleted: the node has 2 cores);
3. a greedy chat completion through the Service equals the same request served by the worker outside
   the cluster; without the API key /v1 answers 401, /health and /metrics stay open;
4. a real Prometheus, discovering pods through the apiserver, scrapes ``nightjar_*`` from the worker and
   both operator replicas, and every Grafana panel's query returns data unless its inputs saw no event
   in the run, which is checked (Debian's Prometheus has no Kubernetes discoverer: ``pod_sd`` serves the
   apiserver's pods with its labels over http_sd); no shipped alert is pending or firing;
5. the fleet loop writes priors into the ConfigMap and the worker reports applying them;
6. failure drills: bad resources reported naming the field, a model image without the model, missing
   Secrets named by their field, the worker killed under load, the operator killed mid-rollout;
7. ``helm uninstall`` with a NightjarDeployment still present, then deleting its namespace: no object
   left and no stuck finalizer (the chart's pre-delete hook).

The tests share one installation and run in file order; each step's seconds go to build/e2e-timings.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "observability"))
import helpers  # noqa: E402
from helpers import condition  # noqa: E402
from pod_sd import PodDiscovery  # noqa: E402
from promutil import (  # noqa: E402
    RULE_FILES,
    WORKER_METRIC_RELABEL,
    Prometheus,
    base_metrics,
    has_data,
    no_events,
    panel_queries,
)

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

RELEASE, SYSTEM_NS, NS = "nightjar", "nightjar-system", "e2e"
SAMPLE = ROOT / "manifests" / "samples" / "smollm2-oci.yaml"
NAME = "smollm2"
DEMO = ROOT / "manifests" / "samples" / "cpu-demo.yaml"  # the chart NOTES' sample, in SYSTEM_NS
API_KEY = "e2e-" + uuid.uuid4().hex  # the Secret smollm2-oci.yaml names (spec.auth.apiKeySecretRef)
MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "Write a haiku about a nightjar."}]
OPERATOR_ENV = [
    # A short CPU run gives little planner evidence: accept priors from one observation, tick often.
    {"name": "NIGHTJAR_FLEET_PRIORS_MIN_COUNT", "value": "0.5"},
    {"name": "NIGHTJAR_FLEET_INTERVAL_S", "value": "5"},
    {"name": "NIGHTJAR_OPERATOR_RESYNC_SECONDS", "value": "10"},
]


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    """A slow poll that rides over a worker or apiserver that is not answering yet."""
    return helpers.wait_for(cond, timeout, what, interval=1.0,
                            tolerate=(httpx.HTTPError, subprocess.SubprocessError, KeyError))


def chat(base: str, *, max_tokens: int = 32, timeout: float = 120, key: str | None = API_KEY, **extra: Any) -> str:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(f"{base}/v1/chat/completions", timeout=timeout, headers=headers, json={
        "model": MODEL, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0, **extra})
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


def get(node, kind: str, name: str, ns: str = NS) -> dict[str, Any] | None:
    p = node.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    return json.loads(p.stdout) if p.returncode == 0 else None




def service_url(node, name: str = NAME) -> str:
    svc = get(node, "service", name)
    assert svc is not None, f"Service {name} missing"
    return f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}"


def worker_pods(node, name: str = NAME) -> list[dict[str, Any]]:
    out = node.kubectl("get", "pods", "-n", NS, "-l", f"nightjar.dev/deployment={name}", "-o", "json").stdout
    return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    return condition(pod, "Ready").get("status") == "True"


def helm(node, *args: str, timeout: float = 330) -> None:
    p = subprocess.run(["helm", *args], env=node.env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"helm {' '.join(args)} failed:\n{p.stderr[-3000:]}"


# ------------------------------------------------------------------------------------------- setup
@pytest.fixture(scope="module")
def reference() -> str:
    """The same request served by the worker outside the cluster (same package, pair and arguments)."""
    from nightjar_worker.serve import ServerProcess

    with ServerProcess(["--kv-cache-gib", "1", "--max-model-len", "1024", "--dtype", "float32"],
                       env={"NIGHTJAR_TARGET_NAME": MODEL}) as srv:
        return chat(srv.url, key=None)


@pytest.fixture(scope="module")
def installed(node, timings, reference):
    """helm install + the sample NightjarDeployment, Ready."""
    timings.lap("reference completion outside the cluster")
    env = json.dumps(OPERATOR_ENV)
    node.kubectl("create", "namespace", NS)
    helm(node, "install", RELEASE, str(ROOT / "charts" / "nightjar"), "-n", SYSTEM_NS, "--create-namespace",
         "--set-json", f"operator.extraEnv={env}", "--wait", "--timeout", "5m")
    timings.lap("helm install: operator pod Ready")
    # The samples as written (their comments' commands); both workers start side by side.
    node.kubectl("create", "secret", "generic", "smollm2-api-key", "-n", NS, f"--from-literal=api-key={API_KEY}")
    node.kubectl("apply", "-n", NS, "-f", str(SAMPLE))
    node.kubectl("apply", "-n", SYSTEM_NS, "-f", str(DEMO))
    for ns, name in ((NS, NAME), (SYSTEM_NS, "cpu-demo")):
        wait_for(lambda ns=ns, name=name: condition(get(node, "njd", name, ns), "Ready").get("status") == "True", 600,
                 f"NightjarDeployment {ns}/{name} Ready")
    timings.lap("kubectl apply the CPU samples: worker pods Ready")
    yield node
    timings.save({f"cluster_{k}": v for k, v in node.timings.items()})


# ------------------------------------------------------------------------------------------ journey
def operator_pods(node) -> list[dict[str, Any]]:
    return json.loads(node.kubectl("get", "pods", "-n", SYSTEM_NS, "-l", "app.kubernetes.io/component=operator",
                                   "-o", "json").stdout)["items"]


def lease_holder(node) -> str:
    lease = get(node, "lease", "nightjar-operator", SYSTEM_NS) or {}
    return (lease.get("spec") or {}).get("holderIdentity") or ""


def test_operator_runs_under_the_charts_service_account(installed):
    pods = operator_pods(installed)
    assert len(pods) == 2 and all(p["status"]["phase"] == "Running" for p in pods)
    for pod in pods:
        assert pod["spec"]["serviceAccountName"] == "nightjar-operator"
        (cs,) = pod["status"]["containerStatuses"]
        assert cs["ready"] and cs["image"].endswith("nightjar-operator:0.1.0")
    # One operates (holds the Lease), the other stands by.
    holder = wait_for(lambda: lease_holder(installed), 60, "the operator's Lease")
    assert [p["metadata"]["name"] for p in pods if holder.startswith(p["metadata"]["name"] + "_")], (holder, pods)


def test_worker_pod_runs_the_images(installed):
    (pod,) = worker_pods(installed)
    assert ready(pod) and pod["status"]["podIP"].startswith("10.244.")
    inits = {s["name"]: s["state"] for s in pod["status"]["initContainerStatuses"]}
    assert set(inits) == {"model-target", "model-draft"}
    assert all(s.get("terminated", {}).get("exitCode") == 0 for s in inits.values()), inits


def test_the_notes_sample_serves_what_helm_test_asks(installed, timings):
    """cpu-demo.yaml, applied where the chart's NOTES say, is what `helm test` queries by default:
    GET /v1/models through its Service, with no key (the test cluster has no DNS for the hook pod's
    URL; tests/observability runs the hook's own script against a real worker)."""
    svc = get(installed, "service", "cpu-demo", SYSTEM_NS)
    assert svc is not None
    r = httpx.get(f"http://{svc['spec']['clusterIP']}:8000/v1/models", timeout=30)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == MODEL, r.text
    installed.kubectl("delete", "njd", "cpu-demo", "-n", SYSTEM_NS, "--wait=true", timeout=120)
    timings.lap("cpu-demo answers /v1/models, deleted")


def test_completion_through_the_service_equals_the_worker_outside(installed, reference, timings):
    got = chat(service_url(installed))
    timings.lap("chat completion through the Service")
    assert got == reference and got.strip()


def test_the_api_needs_the_key_and_probes_and_metrics_do_not(installed):
    """spec.auth.apiKeySecretRef: vLLM's own check (VLLM_API_KEY) guards /v1 through the Service;
    the kubelet's probes (the pod is Ready) and the scrapes of /metrics need no key."""
    url = service_url(installed)
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code == 401
    wrong = {"Authorization": "Bearer not-the-key"}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, headers=wrong, timeout=60).status_code == 401
    assert httpx.get(f"{url}/v1/models", timeout=30).status_code == 401
    # Generation outside /v1 that vLLM's own check leaves open (SageMaker's /invocations): the
    # worker's middleware (nightjar_worker.apikey) asks the key there too.
    assert httpx.post(f"{url}/invocations", json=body, timeout=60).status_code == 401
    ok = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
    assert ok.status_code == 200 and ok.json()["data"][0]["id"] == MODEL, ok.text
    (pod,) = worker_pods(installed)
    for path in ("/health", "/metrics"):
        assert httpx.get(f"http://{pod['status']['podIP']}:8000{path}", timeout=30).status_code == 200, path
    # The sample's NetworkPolicy, accepted by the apiserver (Kubernetes 1.20 here enforces none):
    # the operator's pods (from the chart) and the sample's peer, on the worker port only.
    policy = get(installed, "networkpolicy", NAME)
    assert policy is not None
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": SYSTEM_NS}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator",
                                         "app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/name": "nightjar"}}},
        {"podSelector": {}},
    ], rule
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "nightjar-worker",
                                                           "nightjar.dev/deployment": NAME}


def _prometheus(workdir: Path, sd_url: str) -> Prometheus:
    """Pods discovered through the apiserver (kubernetes_sd_configs' pod labels, served by pod_sd),
    relabelled as the chart's PodMonitor and ServiceMonitor do."""
    sd = [{"url": sd_url, "refresh_interval": "2s"}]
    common = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    ]
    workers = {
        "job_name": "nightjar-workers", "scrape_interval": "2s", "scrape_timeout": "2s",
        "http_sd_configs": sd, "metric_relabel_configs": WORKER_METRIC_RELABEL,
        "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name",
                               "__meta_kubernetes_pod_label_app_kubernetes_io_managed_by"],
             "regex": "nightjar-worker;nightjar-operator", "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "http", "action": "keep"},
            *common,
            {"source_labels": ["__meta_kubernetes_pod_label_nightjar_dev_deployment"], "target_label": "nightjar_deployment"},
            {"source_labels": ["__meta_kubernetes_pod_label_nightjar_dev_track"], "target_label": "track"},
        ],
    }
    operator = {  # honor_labels as the chart's ServiceMonitor: the per-deployment `namespace` label stays
        "job_name": "nightjar-operator", "scrape_interval": "2s", "scrape_timeout": "2s", "http_sd_configs": sd,
        "honor_labels": True,
        "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"], "regex": "operator",
             "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "metrics", "action": "keep"},
            *common,
        ],
    }
    return Prometheus(workdir, [workers, operator], RULE_FILES)


def test_prometheus_scrapes_the_pods_and_every_panel_has_data(installed, tmp_path, timings):
    discovery = PodDiscovery(installed)
    prom = _prometheus(tmp_path / "prom", discovery.url)
    try:
        # Every operator replica serves /metrics (the standby says nightjar_operator_leader 0).
        wait_for(lambda: len(prom.query('up{job="nightjar-operator"} == 1')["result"]) == 2
                 and len(prom.query('up{job="nightjar-workers"} == 1')["result"]) >= 1, 60,
                 "the worker and both operator replicas up")
        leaders = sorted(float(r["value"][1]) for r in prom.query("nightjar_operator_leader")["result"])
        assert leaders == [0.0, 1.0], leaders
        url = service_url(installed)
        for _ in range(4):  # traffic, so the rates and histograms have samples in their windows
            chat(url, max_tokens=24)
            time.sleep(2)
        time.sleep(6)
        series = {s["metric"]["__name__"] for s in prom.query('{__name__=~"nightjar_.*"}')["result"]}
        assert any(n.startswith("nightjar_operator_") for n in series), sorted(series)
        assert {"nightjar_steps_total", "nightjar_gamma_current"} <= series, sorted(series)
        data, quiet, empty = [], [], []
        for title, expr in panel_queries():
            if has_data(prom.query(expr)):
                data.append(title)
            elif no_events(prom, base_metrics(expr)):
                quiet.append(title)  # e.g. no offload or reconcile error happened in this run: checked
            else:
                empty.append((title, expr))
        timings.lap("Prometheus: targets discovered, panels queried")
        timings.note("panels_with_data", len(set(data)))
        timings.note("panels_quiet_no_event", sorted(set(quiet)))
        assert not empty, "panels without data:\n" + "\n".join(f"{t}: {e}" for t, e in empty)
        assert len(set(data)) > 3 * len(set(quiet)), (sorted(set(data)), sorted(set(quiet)))
        # Silent when healthy: after this run no shipped alert is even pending (its condition true).
        # The objective the SLO alerts use is the sample's spec.slo.attainment, from the operator.
        budget = prom.query(f'nightjar:slo_error_budget{{nightjar_deployment="{NAME}"}}')["result"]
        assert [round(float(r["value"][1]), 6) for r in budget] == [0.1], budget
        alerts = prom.query("ALERTS")["result"]
        assert not alerts, [r["metric"] for r in alerts]
        timings.lap("Prometheus: no alert pending or firing")
    finally:
        prom.stop()
        discovery.close()


def test_fleet_priors_reach_the_worker(installed, timings):
    def priors() -> dict[str, Any] | None:
        cm = get(installed, "configmap", f"{NAME}-config")
        doc = yaml.safe_load(((cm or {}).get("data") or {}).get("nightjar.yaml") or "{}") or {}
        return (doc.get("priors") or {}).get("entries") and doc["priors"]

    url = service_url(installed)
    for _ in range(2):
        chat(url, max_tokens=16)
    wait_for(priors, 120, "priors from the fleet loop in the ConfigMap")
    (pod,) = worker_pods(installed)
    metrics = f"http://{pod['status']['podIP']}:8000/metrics"

    def reloads() -> float:
        text = httpx.get(metrics, timeout=5).text
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("nightjar_config_reloads_total"))

    wait_for(lambda: reloads() >= 1, 120, "the worker applying the priors (nightjar_config_reloads_total)")
    # The CPU worker runs elastic draft memory (offload Auto) and the fleet loop says so.
    mem = wait_for(lambda: condition(get(installed, "njd", NAME), "ElasticMemory").get("status") == "True"
                   and condition(get(installed, "njd", NAME), "ElasticMemory"), 60, "ElasticMemory=True")
    assert mem["reason"] == "Active" and "1/1 pods" in mem["message"], mem
    timings.lap("fleet priors written and applied by the worker")


# ------------------------------------------------------------------------------------ failure drills
def _bad(name: str, **source: Any) -> dict[str, Any]:
    doc = yaml.safe_load(SAMPLE.read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["target"]["source"] = {"image": source}
    # These pods never serve: small requests keep the one 2-core node free for the real worker.
    doc["spec"]["resources"] = {"requests": {"cpu": "10m", "memory": "64Mi"}}
    return doc


def test_invalid_resources_are_rejected_or_reported(installed, timings):
    bad_field = _bad("bad-field", reference="ghcr.io/nightjar-dev/nightjar-models:smollm2-135m", path=MODEL)
    bad_field["spec"]["speculation"]["maxGamma"] = -1
    p = installed.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(bad_field), check=False)
    assert p.returncode != 0 and "spec.speculation.maxGamma" in p.stderr, p.stderr

    drills = ("no-such-image", "empty-model", "hub-no-token", "bad-scheme", "no-api-key")
    try:
        installed.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(
            _bad("no-such-image", reference="ghcr.io/nightjar-dev/no-such-models:1", path=MODEL)))
        installed.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(
            _bad("empty-model", reference="ghcr.io/nightjar-dev/nightjar-models:smollm2-135m", path="no-such-model")))
        # A Hub model whose token Secret does not exist: the kubelet cannot build the worker's env
        # (no crash loop), and the operator names the field; an unsupported URI scheme never deploys.
        hub = _bad("hub-no-token", reference="unused")
        hub["spec"]["target"]["source"] = {"uri": "hf://HuggingFaceTB/SmolLM2-135M"}
        hub["spec"]["hub"] = {"tokenSecretRef": {"name": "hf-token-missing"}}
        scheme = _bad("bad-scheme", reference="unused")
        scheme["spec"]["target"]["source"] = {"uri": "s3://bucket/smollm2"}
        key = _bad("no-api-key", reference="ghcr.io/nightjar-dev/nightjar-models:smollm2-135m", path=MODEL)
        key["spec"]["auth"] = {"apiKeySecretRef": {"name": "api-key-missing"}}
        key["spec"].pop("networkPolicy", None)
        for doc in (hub, key):
            installed.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(doc))
        # A semantic error is refused at apply time by the operator's admission webhook (reached
        # through its Service), naming the field.
        p = installed.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(scheme), check=False)
        assert p.returncode != 0 and 'The NightjarDeployment "bad-scheme" is invalid' in p.stderr, p.stderr
        assert "spec.target.source.uri: scheme s3:// is not supported" in p.stderr, p.stderr

        def degraded(name: str) -> str | None:
            cond = condition(get(installed, "njd", name), "Degraded")
            return cond.get("status") == "True" and cond.get("reason") == "PodFailing" and cond["message"]

        msg = wait_for(lambda: degraded("no-such-image"), 180, "Degraded for the unknown model image")
        assert "init container model-target (spec.target.source.image)" in msg and "ImagePull" in msg, msg
        msg = wait_for(lambda: degraded("empty-model"), 180, "Degraded for the image without the model")
        assert "(spec.target.source.image)" in msg and "has no /models/no-such-model/config.json" in msg, msg
        msg = wait_for(lambda: degraded("hub-no-token"), 180, "Degraded for the missing Hub token Secret")
        assert "container worker (spec.hub.tokenSecretRef): CreateContainerConfigError" in msg, msg
        assert 'secret "hf-token-missing" not found' in msg, msg
        msg = wait_for(lambda: degraded("no-api-key"), 180, "Degraded for the missing API key Secret")
        assert "container worker (spec.auth.apiKeySecretRef): CreateContainerConfigError" in msg, msg
    finally:  # a failed drill must not leave pods that starve the next tests of the node's CPU
        for name in drills:
            installed.kubectl("delete", "njd", name, "-n", NS, "--wait=true", "--ignore-not-found", timeout=120)
    timings.lap("drill: invalid resources reported")


def test_worker_killed_under_load_recovers(installed, reference, timings):
    (pod,) = worker_pods(installed)
    restarts = pod["status"]["containerStatuses"][0]["restartCount"]
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    url = service_url(installed)
    outcomes: list[str] = []

    def request() -> None:
        try:
            chat(url, max_tokens=800, timeout=90, ignore_eos=True)  # still running when the kill comes
            outcomes.append("completed")
        except httpx.HTTPError as e:  # the connection dies with the container: an error, never a hang
            outcomes.append(f"error: {type(e).__name__}")

    threads = [threading.Thread(target=request) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(3)
    installed.node.ctr("tasks", "kill", "-s", "SIGKILL", container_id)
    for t in threads:
        t.join(120)
    assert len(outcomes) == 4 and any(o.startswith("error") for o in outcomes), outcomes

    def back() -> bool:
        pods = worker_pods(installed)
        return len(pods) == 1 and ready(pods[0]) and pods[0]["status"]["containerStatuses"][0]["restartCount"] > restarts

    wait_for(back, 300, "the worker container restarted and Ready")
    assert wait_for(lambda: chat(url), 120, "a completion after the restart") == reference
    timings.lap("drill: worker killed under load, recovered")


def test_operator_killed_mid_rollout_leaves_no_duplicate(installed, timings):
    # A new draft revision (the same draft files under a new name: the target as its own draft is
    # refused by the admission webhook) starts a canary: a candidate Deployment and ConfigMap.
    patch = {"spec": {"draft": {"name": "smollm2-135m-draft-v2"}}}
    installed.kubectl("patch", "njd", NAME, "-n", NS, "--type=merge", "-p", json.dumps(patch))
    wait_for(lambda: get(installed, "deployment", f"{NAME}-candidate"), 120, "the candidate Deployment")
    # The operating replica dies; the standby takes the Lease over and finishes the job.
    holder = lease_holder(installed)
    leader = holder.rsplit("_", 1)[0]
    installed.kubectl("delete", "pod", leader, "-n", SYSTEM_NS, "--grace-period=0", "--force")
    new = wait_for(lambda: (h := lease_holder(installed)) != holder and h, 90, "the standby holding the Lease")
    assert not new.startswith(leader + "_")

    def operator_back() -> bool:
        pods = operator_pods(installed)
        return len(pods) == 2 and all(ready(p) for p in pods)

    wait_for(operator_back, 180, "two operator pods Ready again")
    time.sleep(20)  # two resync periods of the new leader
    owned: dict[str, list[str]] = {}
    for kind in ("deployments", "configmaps", "services"):
        items = json.loads(installed.kubectl("get", kind, "-n", NS, "-l", "app.kubernetes.io/managed-by=nightjar-operator",
                                             "-o", "json").stdout)["items"]
        owned[kind] = sorted(i["metadata"]["name"] for i in items)
        for i in items:
            refs = i["metadata"].get("ownerReferences") or []
            assert [r["name"] for r in refs] == [NAME], (kind, i["metadata"]["name"], refs)
    assert owned == {
        "deployments": [NAME, f"{NAME}-candidate"],
        "configmaps": [f"{NAME}-candidate-config", f"{NAME}-config"],
        "services": [NAME],
    }, owned
    timings.lap("drill: operator killed mid-rollout")


# ------------------------------------------------------------------------------------------ uninstall
def test_uninstall_with_a_deployment_present_leaves_nothing_stuck(installed, timings):
    """The chart's pre-delete hook deletes the NightjarDeployments while the operator still runs to
    remove its finalizer; the user's namespace then deletes without waiting on anything."""
    assert get(installed, "njd", NAME) is not None  # still there: nobody deleted it by hand
    helm(installed, "uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", "--timeout", "5m", timeout=330)
    timings.lap("helm uninstall with a NightjarDeployment present")
    assert not json.loads(installed.kubectl("get", "njd", "-A", "-o", "json").stdout)["items"]
    installed.kubectl("delete", "namespace", NS, "--wait=true", timeout=300)

    left: list[str] = []

    def gone() -> bool:
        left[:] = installed.kubectl("get", "all,configmaps,serviceaccounts,roles,rolebindings,jobs", "-n", SYSTEM_NS,
                                    "-l", "app.kubernetes.io/instance=nightjar", "-o", "name").stdout.split()
        left.extend(installed.kubectl("get", "namespace", NS, "-o", "name", check=False).stdout.split())
        return not left

    try:
        wait_for(gone, 300, "no object of the release and no worker namespace left")
    except AssertionError as e:
        raise AssertionError(f"{e}; left: {left}") from None
    assert not installed.kubectl("get", "clusterroles,clusterrolebindings", "-o", "name",
                                 "-l", "app.kubernetes.io/instance=nightjar").stdout.split()
    # The chart keeps the CRD (crds.keep); removing it afterwards must not hang on a finalizer.
    installed.kubectl("delete", "crd", "nightjardeployments.nightjar.dev", "--wait=true", timeout=60)
    timings.lap("namespace and CRD deleted: nothing left, nothing stuck")
