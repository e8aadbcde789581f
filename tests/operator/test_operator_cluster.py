"""The operator against a real kube-apiserver (+ controller-manager, scheduler, node agent).

Containers never run on this cluster: the node agent only reports pods Running/Ready, so these tests
check what the operator and the real controllers do with the objects (children, status, scale,
garbage collection, RBAC), not the worker process itself.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import condition, cr, wait_for
from kopf.testing import KopfRunner
from nightjar_operator import constants as c
from nightjar_operator.handlers.k8s import Api, make_api_client
from nightjar_operator.metrics import metrics
from prometheus_client import REGISTRY

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
RUN_ARGS = ["run", "--standalone", "--all-namespaces", "-m", "nightjar_operator.main"]








@pytest.fixture
def api(k8s) -> Api:
    return Api(make_api_client(k8s.kubeconfig))


class Cluster:
    """Small helpers bound to one namespace."""

    def __init__(self, k8s, api: Api, namespace: str) -> None:
        self.k8s, self.api, self.ns = k8s, api, namespace

    def apply(self, obj: dict[str, Any], *args: str, **kw: Any) -> subprocess.CompletedProcess:
        return self.k8s.kubectl("apply", "-n", self.ns, *args, "-f", "-", input=yaml.safe_dump(obj), **kw)

    def njd(self, name: str) -> dict[str, Any] | None:
        return self.api.get(c.KIND, self.ns, name)

    def child(self, kind: str, name: str) -> dict[str, Any] | None:
        return self.api.get(kind, self.ns, name)

    def patch(self, name: str, spec: dict[str, Any]) -> None:
        self.k8s.kubectl("patch", "njd", name, "-n", self.ns, "--type", "merge", "-p", json.dumps({"spec": spec}))

    def ready(self, name: str, generation: int | None = None, replicas: int | None = None) -> dict[str, Any] | None:
        obj = self.njd(name)
        st = (obj or {}).get("status") or {}
        gen = generation if generation is not None else (obj or {}).get("metadata", {}).get("generation")
        ok = condition(obj, "Ready").get("status") == "True" and st.get("observedGeneration") == gen
        if replicas is not None:
            ok = ok and st.get("readyReplicas") == replicas
        return obj if ok else None

    def wait_ready(self, name: str, timeout: float = 90, **kw: Any) -> dict[str, Any]:
        return wait_for(lambda: self.ready(name, **kw), timeout, f"{name} Ready")

    def listing(self, kind: str, selector: str) -> list[dict[str, Any]]:
        path = self.api.path(kind, self.ns) if kind in ("Deployment", "Service", "ConfigMap") else None
        if kind == "Pod":
            path = f"/api/v1/namespaces/{self.ns}/pods"
        if kind == "ReplicaSet":
            path = f"/apis/apps/v1/namespaces/{self.ns}/replicasets"
        assert path
        return self.api.request("GET", path, query={"labelSelector": selector})["items"]

    def events(self, name: str) -> list[dict[str, Any]]:
        items = self.api.request(
            "GET", f"/api/v1/namespaces/{self.ns}/events", query={"fieldSelector": f"involvedObject.name={name}"}
        )["items"]
        return [e for e in items if e["involvedObject"]["kind"] == c.KIND]


@pytest.fixture
def cl(k8s, api, namespace, crd) -> Cluster:
    return Cluster(k8s, api, namespace)


def children_snapshot(cl: Cluster, name: str) -> dict[str, tuple[Any, ...]]:
    dep = cl.child("Deployment", name)
    svc = cl.child("Service", name)
    cm = cl.child("ConfigMap", c.config_map_name(name))
    assert dep and svc and cm
    return {
        "Deployment": (dep["metadata"]["generation"], json.dumps(dep["spec"], sort_keys=True)),
        "Service": (svc["metadata"]["resourceVersion"],),
        "ConfigMap": (cm["metadata"]["resourceVersion"],),
    }


def sample(metric: str, **labels: str) -> float:
    metrics()  # make sure the collectors exist
    return REGISTRY.get_sample_value(metric, labels) or 0.0


def child_writes() -> dict[tuple[str, str], float]:
    return {
        (kind, action): sample("nightjar_operator_child_writes_total", kind=kind, action=action)
        for kind in ("Deployment", "Service", "ConfigMap")
        for action in ("create", "update")
    }


def delete_and_wait(cl: Cluster, name: str, timeout: float = 60) -> None:
    """Delete while the operator still runs: kopf holds a finalizer for its timer/daemon."""
    cl.k8s.kubectl("delete", "njd", name, "-n", cl.ns, "--wait=false")
    wait_for(lambda: cl.njd(name) is None, timeout, f"{name} deleted")


def assert_clean(output: str) -> None:
    """None of the operator's own handlers failed with an unexpected exception (retries are fine)."""
    bad = [ln for ln in output.splitlines()
           if re.search(r"(Handler|Timer) '(reconcile|resync|child_deployment|login|startup)' failed with an exception", ln)]  # fmt: skip
    assert not bad, "\n".join(bad[:5]) + "\n" + output[-4000:]


def assert_no_forbidden(output: str) -> None:
    # Every apiserver 403 says "forbidden" (kopf: APIForbiddenError); a bare "403" also matches a log
    # timestamp's milliseconds (",403"), so it is not searched for.
    bad = [ln for ln in output.splitlines() if "forbidden" in ln.lower()]
    assert not bad, "\n".join(bad[:10])


# ------------------------------------------------------------------------------------------ tests
def test_lifecycle_create_update_scale_delete(cl: Cluster):
    name = "life"
    with KopfRunner(RUN_ARGS, timeout=60) as runner:
        cl.apply(cr(name))
        obj = cl.wait_ready(name, replicas=2)
        uid = obj["metadata"]["uid"]
        st = obj["status"]
        assert st["replicas"] == 2 and st["target"] == "target-1" and st["draft"] == "draft-1"
        assert st["selector"] == f"app.kubernetes.io/name=nightjar-worker,nightjar.dev/deployment={name}"
        assert {x["type"] for x in st["conditions"]} == {"Ready", "Progressing", "Degraded", "SLOMet", "ElasticMemory"}
        assert all(x["observedGeneration"] == obj["metadata"]["generation"] for x in st["conditions"])
        for kind, child in (("Deployment", name), ("Service", name), ("ConfigMap", f"{name}-config")):
            refs = cl.child(kind, child)["metadata"]["ownerReferences"]
            assert [(r["kind"], r["uid"], r["controller"]) for r in refs] == [(c.KIND, uid, True)], kind
        pods = cl.listing("Pod", f"nightjar.dev/deployment={name}")
        assert len(pods) == 2
        svc = cl.child("Service", name)
        assert svc["spec"]["ports"][0]["port"] == 8000

        # Printer columns.
        out = cl.k8s.kubectl("get", "njd", name, "-n", cl.ns).stdout
        header, row = out.splitlines()[:2]
        assert header.split() == ["NAME", "READY", "REPLICAS", "TARGET", "DRAFT", "STABLE", "CANDIDATE", "AGE"]
        assert row.split()[:5] == [name, "True", "2", "target-1", "draft-1"]

        # Update image.
        cl.patch(name, {"image": "example.org/nightjar-worker:2"})
        cl.wait_ready(name, replicas=2)
        dep = cl.child("Deployment", name)
        assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "example.org/nightjar-worker:2"

        # Update the model pair: args, pod annotations and status follow (strategy Replace: no
        # candidate revision; the Canary rollout is tested in tests/fleet/).
        cl.patch(name, {"target": {"name": "target-2", "source": {"imagePath": "/models/target-2"}},
                        "draft": {"name": "draft-2", "source": {"uri": "hf://org/draft-2", "imagePath": None},
                                  "revision": "r1"},
                        "rollout": {"strategy": "Replace"}})
        obj = cl.wait_ready(name, replicas=2)
        args = cl.child("Deployment", name)["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--model") + 1] == "/models/target-2"
        assert args[args.index("--draft") + 1] == "org/draft-2"
        assert (obj["status"]["target"], obj["status"]["draft"]) == ("target-2", "draft-2")

        # Update replicas through the spec, then through the scale subresource.
        cl.patch(name, {"replicas": 1})
        cl.wait_ready(name, replicas=1)
        assert cl.child("Deployment", name)["spec"]["replicas"] == 1
        cl.k8s.kubectl("scale", "njd", name, "-n", cl.ns, "--replicas=3")
        cl.wait_ready(name, replicas=3)
        assert cl.child("Deployment", name)["spec"]["replicas"] == 3
        scale = cl.api.request("GET", cl.api.path(c.KIND, cl.ns, name, "scale"))
        assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
        assert scale["status"]["selector"] == obj["status"]["selector"]

        # Drift: a hand edit of the Deployment is reverted (child event -> reconcile).
        cl.k8s.kubectl("scale", "deployment", name, "-n", cl.ns, "--replicas=5")
        wait_for(lambda: cl.child("Deployment", name)["spec"]["replicas"] == 3, 60, "drift repaired")

        reasons = {e["reason"] for e in cl.events(name)}
        assert {"Created", "Updated", "Ready"} <= reasons, reasons

        # Delete: the garbage collector (controller-manager) removes every child via ownerReferences.
        cl.k8s.kubectl("delete", "njd", name, "-n", cl.ns, "--wait=true")

        def gone() -> bool:
            left = [cl.child("Deployment", name), cl.child("Service", name), cl.child("ConfigMap", f"{name}-config")]
            return all(x is None for x in left) and not cl.listing("Pod", f"nightjar.dev/deployment={name}")

        wait_for(gone, 90, "children garbage-collected")
    assert runner.exit_code == 0
    assert_clean(runner.output)


SCHEMA_VIOLATIONS = [
    ({"speculation": {"maxGamma": 99}}, "spec.speculation.maxGamma"),
    ({"slo": {"tpotP95Ms": "fast"}}, "spec.slo.tpotP95Ms"),
    ({"slo": {"attainment": 1.5}}, "spec.slo.attainment"),
    ({"replicas": -1}, "spec.replicas"),
    ({"speculation": {"offload": {"policy": "Sometimes"}}}, "spec.speculation.offload.policy"),
    ({"target": {"name": "t", "source": {"imagePath": "/a", "uri": "hf://a/b"}}}, "spec.target.source"),
    ({"draft": {"name": "d", "source": {"imagePath": "relative/path"}}}, "spec.draft.source.imagePath"),
    ({"resources": {"requests": {"memory": "lots"}}}, "spec.resources.requests.memory"),
]


def test_schema_violations_rejected_by_apiserver(cl: Cluster):
    # --validate=false: no kubectl-side checks, the apiserver's structural schema decides.
    for spec, field in SCHEMA_VIOLATIONS:
        proc = cl.apply(cr("bad", **spec), "--validate=false", check=False)
        assert proc.returncode != 0, (field, proc.stdout)
        assert field in proc.stderr, (field, proc.stderr)
    body = cr("bad")
    del body["spec"]["draft"]
    proc = cl.apply(body, "--validate=false", check=False)
    assert proc.returncode != 0 and "spec.draft" in proc.stderr, proc.stderr
    assert cl.njd("bad") is None


def test_invalid_spec_reported_and_children_untouched(cl: Cluster):
    name = "sem"
    with KopfRunner(RUN_ARGS, timeout=60) as runner:
        cl.apply(cr(name))
        cl.wait_ready(name, replicas=2)
        before = children_snapshot(cl, name)

        cl.patch(name, {"draft": {"name": "draft-1", "source": {"imagePath": "/models/target-1"}}})

        def invalid(field: str) -> dict[str, Any] | None:
            obj = cl.njd(name)
            ready = condition(obj, "Ready")
            ok = (
                ready.get("reason") == "InvalidSpec"
                and field in ready.get("message", "")
                and ready.get("observedGeneration") == obj["metadata"]["generation"]
            )
            return obj if ok else None

        obj = wait_for(lambda: invalid("spec.draft.source"), 60, "InvalidSpec naming spec.draft.source")
        assert condition(obj, "Ready")["status"] == "False"
        assert obj["status"]["readyReplicas"] == 2  # the old workers keep serving
        cl.patch(name, {"draft": {"name": "draft-1", "source": {"imagePath": "/models/draft-1"}},
                        "speculation": {"maxGamma": 4, "arms": [0, 2, 9]}})
        wait_for(lambda: invalid("spec.speculation.arms[2]"), 60, "InvalidSpec naming the unknown arm")
        cl.patch(name, {"speculation": {"maxGamma": 40, "arms": None}})
        wait_for(lambda: invalid("spec.speculation.maxGamma"), 60, "InvalidSpec naming maxGamma")
        assert children_snapshot(cl, name) == before
        assert any(e["reason"] == "InvalidSpec" and e["type"] == "Warning" for e in cl.events(name))

        # Fixing the spec resumes reconciling.
        cl.patch(name, {"speculation": {"maxGamma": 6}})
        cl.wait_ready(name, replicas=2)
        assert children_snapshot(cl, name)["Deployment"] != before["Deployment"]  # K changed: pods roll
        delete_and_wait(cl, name)
    assert_clean(runner.output)


def test_pod_overrides_reach_the_pods_and_a_refused_one_names_its_field(cl: Cluster):
    """The apiserver accepts the worker pods with the overrides (it validates the pod template), and
    one it refuses (422) is Degraded=ChildRejected naming the spec.pod field while the pods serve on."""
    name = "ovr"
    pod = {
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                       "whenUnsatisfiable": "ScheduleAnyway"}],
        "labels": {"team": "search"}, "annotations": {"example.org/owner": "search"},
        "env": [{"name": "EXTRA", "value": "1"}],
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}],
        "volumeMounts": [{"name": "scratch", "mountPath": "/var/scratch"}],
    }
    with KopfRunner(RUN_ARGS, timeout=60) as runner:
        cl.apply(cr(name, pod=pod, drain={"drainSeconds": 20}))
        cl.wait_ready(name, replicas=2)
        (p,) = cl.listing("Pod", f"nightjar.dev/deployment={name}")[:1]
        ps = p["spec"]
        assert ps["nodeSelector"] == pod["nodeSelector"] and ps["terminationGracePeriodSeconds"] == 5 + 20 + 15
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in ps["tolerations"]
        assert ps["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"]["nightjar.dev/deployment"] == name
        assert p["metadata"]["labels"]["team"] == "search"
        worker = ps["containers"][0]
        assert {"name": "EXTRA", "value": "1"} in worker["env"]
        assert any(m["mountPath"] == "/var/scratch" for m in worker["volumeMounts"])
        before = children_snapshot(cl, name)

        # A claim volume without a claimName passes the CRD schema (core/v1 objects are kept whole)
        # and the operator's checks; the apiserver refuses the Deployment.
        cl.patch(name, {"pod": {**pod, "volumes": [{"name": "scratch", "persistentVolumeClaim": {"readOnly": True}}]}})

        def rejected() -> dict[str, Any] | None:
            deg = condition(cl.njd(name), "Degraded")
            return deg if deg.get("reason") == "ChildRejected" else None

        deg = wait_for(rejected, 60, "Degraded=ChildRejected")
        assert deg["status"] == "True" and "spec.pod.volumes[0].persistentVolumeClaim.claimName" in deg["message"], deg
        assert condition(cl.njd(name), "Ready")["reason"] == "ChildRejected"
        assert children_snapshot(cl, name) == before  # the running pods are left as they were
        cl.patch(name, {"pod": pod})
        cl.wait_ready(name, replicas=2)
        assert condition(cl.njd(name), "Degraded")["reason"] == "AsExpected"
        delete_and_wait(cl, name)
    assert_clean(runner.output)


def test_the_gpu_sample_reaches_gpu_pods_with_its_hub_token_and_cache(cl: Cluster):
    """manifests/samples/gpu-pair.yaml, with a token Secret, through the operator to the pods the
    controllers create: the sample's image, the Hub ids as vLLM's model arguments, HF_TOKEN from the
    Secret, the cache volume under HF_HOME, one GPU per pod counted by the scheduler, and a GPU
    pool replaced in place (no surge pod that would need a spare GPU)."""
    doc = yaml.safe_load((ROOT / "manifests/samples/gpu-pair.yaml").read_text())
    name, spec = doc["metadata"]["name"], doc["spec"]
    spec["hub"] = {"tokenSecretRef": {"name": "hf-token"}}
    cl.k8s.kubectl("create", "secret", "generic", "hf-token", "-n", cl.ns, "--from-literal=HF_TOKEN=hf_test")
    with KopfRunner(RUN_ARGS, timeout=60) as runner:
        cl.apply(doc)
        cl.wait_ready(name, replicas=spec["replicas"])
        dep = cl.child("Deployment", name)
        assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
        pods = cl.listing("Pod", f"nightjar.dev/deployment={name}")
        assert len(pods) == spec["replicas"] and all(p["spec"].get("nodeName") for p in pods)
        ps = pods[0]["spec"]
        worker = ps["containers"][0]
        assert worker["image"] == spec["image"]
        assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1" == worker["resources"]["requests"]["nvidia.com/gpu"]
        args = worker["args"]
        assert args[args.index("--model") + 1] == "Qwen/Qwen3-8B"
        assert args[args.index("--draft") + 1] == "Qwen/Qwen3-0.6B"
        assert args[args.index("--device") + 1] == "cuda"  # told, not probed before vLLM forks
        assert args[-2:] == spec["vllmArgs"]
        # CUDA graphs and async scheduling are the worker's decision from the device it finds
        # (engine/engine_args.py): the operator never forces eager mode on a GPU pod.
        assert "--enforce-eager" not in args
        env = {e["name"]: e for e in worker["env"]}
        assert env["VLLM_USE_V2_MODEL_RUNNER"]["value"] == "0"  # the runner the worker's hooks are on
        assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}
        assert json.loads(env["NIGHTJAR_MEMORY"]["value"]) == {
            "enabled": True, "policy": {"kv_usage_high": 0.9, "kv_usage_low": 0.7}}
        assert {"name": "cache", "emptyDir": {"sizeLimit": "40Gi"}} in ps["volumes"]
        cache_mount = next(m for m in worker["volumeMounts"] if m["name"] == "cache")["mountPath"]
        assert env["HF_HOME"]["value"].startswith(cache_mount + "/")
        delete_and_wait(cl, name)
    assert runner.exit_code == 0
    assert_clean(runner.output)


def test_disruption_budget_follows_the_replicas(cl: Cluster):
    """A PodDisruptionBudget over the pool while replicas > 1 (in the policy version the apiserver
    serves); gone at one replica or when turned off; a foreign one of the same name is left alone."""
    name = "pdb"

    def pdb() -> dict[str, Any] | None:
        return cl.api.get("PodDisruptionBudget", cl.ns, name)

    with KopfRunner(RUN_ARGS, timeout=60) as runner:
        cl.apply(cr(name, replicas=3, disruptionBudget={"maxUnavailable": "34%"}))
        cl.wait_ready(name, replicas=3)
        budget = wait_for(pdb, 30, "the PodDisruptionBudget")
        assert budget["apiVersion"] == cl.api.pdb_api_version()
        assert budget["spec"]["maxUnavailable"] == "34%"
        assert budget["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "nightjar-worker",
                                                             "nightjar.dev/deployment": name}
        # The disruption controller counts the pool's pods against it.
        wait_for(lambda: ((pdb() or {}).get("status") or {}).get("expectedPods") == 3, 60, "expectedPods 3")
        cl.k8s.kubectl("scale", "njd", name, "-n", cl.ns, "--replicas=1")
        cl.wait_ready(name, replicas=1)
        wait_for(lambda: pdb() is None, 30, "the budget removed at one replica")
        cl.patch(name, {"replicas": 2, "disruptionBudget": {"enabled": False}})
        cl.wait_ready(name, replicas=2)
        assert pdb() is None
        delete_and_wait(cl, name)
    assert_clean(runner.output)


def test_autoscaler_scales_through_the_scale_subresource(cl: Cluster):
    """spec.autoscaling HPA: the operator owns a HorizontalPodAutoscaler (in the version the apiserver
    serves) whose target is the NightjarDeployment; the HPA controller raises it to minReplicas through
    the scale subresource and the operator follows with the worker Deployment. KEDA where KEDA is not
    installed is a condition naming the field; turning autoscaling off removes the HPA."""
    name = "scaled"

    def hpa() -> dict[str, Any] | None:
        return cl.api.get("HorizontalPodAutoscaler", cl.ns, name)

    with KopfRunner(RUN_ARGS, timeout=60) as runner:
        cl.apply(cr(name, replicas=1, autoscaling={"engine": "HPA", "minReplicas": 2, "maxReplicas": 3}))
        h = wait_for(hpa, 30, "the HorizontalPodAutoscaler")
        assert h["apiVersion"] == cl.api.hpa_api_version()
        assert h["spec"]["scaleTargetRef"] == {"apiVersion": c.API_VERSION, "kind": c.KIND, "name": name}
        # The HPA controller (no metrics adapter here) still enforces minReplicas via the scale subresource.
        obj = cl.wait_ready(name, timeout=120, replicas=2)
        assert obj["spec"]["replicas"] == 2
        assert condition(obj, c.COND_AUTOSCALING)["reason"] == "HorizontalPodAutoscaler"
        assert cl.child("Deployment", name)["spec"]["replicas"] == 2

        cl.patch(name, {"autoscaling": {"engine": "KEDA", "prometheusUrl": "http://prometheus:9090"}})
        wait_for(lambda: hpa() is None, 30, "the HPA removed")
        cond = wait_for(lambda: (x := condition(cl.njd(name), c.COND_AUTOSCALING)).get("reason") == "KEDANotInstalled" and x,
                        30, "KEDANotInstalled")  # fmt: skip
        assert cond["status"] == "False" and cond["message"].startswith("spec.autoscaling.engine:")
        cl.patch(name, {"autoscaling": {"engine": "None"}})
        wait_for(lambda: condition(cl.njd(name), c.COND_AUTOSCALING).get("reason") == "Disabled", 30, "Disabled")
        delete_and_wait(cl, name)
    assert_clean(runner.output)


def test_routing_objects_follow_the_spec(cl: Cluster, routing_crds):
    """spec.routing: the operator owns an InferencePool (its schema checked by the apiserver) and an
    HTTPRoute to it; without the pool the route goes to a Service per revision; turning routing off
    removes them all and says so in the Routing condition."""
    name = "routed"
    route = {"parentRefs": [{"name": "inference-gateway", "namespace": "gateway-system"}]}
    pools = {"endpointPicker": {"name": "routed-epp"}, "candidateEndpointPicker": {"name": "routed-epp-canary"}}

    def backends() -> list[tuple[str, str, int]]:
        r = cl.child("HTTPRoute", name) or {"spec": {"rules": [{"backendRefs": []}]}}
        return [(b["kind"], b["name"], b["weight"]) for b in r["spec"]["rules"][0]["backendRefs"]]

    with KopfRunner(RUN_ARGS, timeout=60) as runner:
        cl.apply(cr(name, replicas=2, routing={"httpRoute": route, "inferencePool": pools}))
        pool = wait_for(lambda: cl.child("InferencePool", name), 30, "the InferencePool")
        assert pool["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "nightjar-worker",
                                                           "nightjar.dev/deployment": name, c.LABEL_TRACK: c.TRACK_STABLE}
        assert pool["spec"]["endpointPickerRef"] == {"kind": "Service", "name": "routed-epp",
                                                     "port": {"number": 9002}, "failureMode": "FailClose"}
        wait_for(lambda: backends() == [("InferencePool", name, 100)], 30, "the HTTPRoute to the pool")
        obj = cl.wait_ready(name, replicas=2)
        assert condition(obj, c.COND_ROUTING)["reason"] == "Routed"
        assert cl.child("InferencePool", c.candidate_name(name)) is None  # no rollout: one pool

        cl.patch(name, {"routing": {"inferencePool": None}})
        wait_for(lambda: backends() == [("Service", f"{name}-stable", 100)], 30, "the HTTPRoute to the stable Service")
        wait_for(lambda: cl.child("InferencePool", name) is None, 30, "the InferencePool removed")
        svc = cl.child("Service", f"{name}-stable")
        assert svc["spec"]["selector"][c.LABEL_TRACK] == c.TRACK_STABLE

        cl.patch(name, {"routing": None})
        wait_for(lambda: condition(cl.njd(name), c.COND_ROUTING).get("reason") == "Disabled", 30, "Disabled")
        wait_for(lambda: cl.child("HTTPRoute", name) is None and cl.child("Service", f"{name}-stable") is None,
                 30, "the HTTPRoute and the stable Service removed")  # fmt: skip
        assert cl.child("Service", name) is not None  # the workers' own Service stays
        delete_and_wait(cl, name)
    assert_clean(runner.output)


def _count_children(cl: Cluster, name: str) -> dict[str, int]:
    sel = f"nightjar.dev/deployment={name}"
    return {kind: len(cl.listing(kind, sel)) for kind in ("Deployment", "Service", "ConfigMap", "ReplicaSet")}


def test_killed_mid_reconcile_restart_converges(cl: Cluster, k8s):
    name = "crash"
    env = {**k8s.env, "NIGHTJAR_OPERATOR_FAULT_PAUSE_AFTER": "Deployment", "NIGHTJAR_OPERATOR_FAULT_PAUSE_SECONDS": "120"}
    log = open(k8s.log_dir / f"operator-{cl.ns}.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "nightjar_operator.cli", "run", "-n", cl.ns, "--metrics-port", "0"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        cl.apply(cr(name))
        wait_for(lambda: cl.child("Deployment", name), 90, "Deployment created by the first operator")
        time.sleep(0.5)
        assert cl.child("Service", name) is None  # paused mid-reconcile: the Service is not there yet
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        log.close()
    assert condition(cl.njd(name), "Ready").get("status") != "True"

    with KopfRunner(RUN_ARGS, timeout=60) as runner:
        cl.wait_ready(name, replicas=2)
        assert _count_children(cl, name) == {"Deployment": 1, "Service": 1, "ConfigMap": 1, "ReplicaSet": 1}
        assert len(cl.listing("Pod", f"nightjar.dev/deployment={name}")) == 2
        uid = cl.njd(name)["metadata"]["uid"]
        for kind, child in (("Deployment", name), ("Service", name), ("ConfigMap", f"{name}-config")):
            assert [r["uid"] for r in cl.child(kind, child)["metadata"]["ownerReferences"]] == [uid]
    assert_clean(runner.output)

    # A second operator start (resume) on a converged object writes nothing.
    snap = children_snapshot(cl, name)
    before = child_writes()
    resumes = sample("nightjar_operator_reconciles_total", trigger="resume", result="ok")
    with KopfRunner(RUN_ARGS, timeout=60):
        wait_for(lambda: sample("nightjar_operator_reconciles_total", trigger="resume", result="ok") > resumes,
                 60, "resume reconcile")  # fmt: skip
        time.sleep(2)
        assert child_writes() == before
        assert children_snapshot(cl, name) == snap
        delete_and_wait(cl, name)


def test_least_privilege_service_account(cl: Cluster, k8s, monkeypatch):
    """Run the operator with the token of a ServiceAccount bound to manifests/rbac: no 403 anywhere."""
    sa = "nightjar-operator"
    binding = f"nightjar-operator-{cl.ns}"
    docs = [yaml.safe_load((ROOT / "manifests/rbac" / f).read_text()) for f in
            ("service_account.yaml", "cluster_role.yaml", "cluster_role_binding.yaml")]  # fmt: skip
    sa_doc, role, bind = docs
    sa_doc["metadata"]["namespace"] = cl.ns
    role["metadata"]["name"] = binding
    bind["metadata"]["name"] = binding
    bind["roleRef"]["name"] = binding
    bind["subjects"][0]["namespace"] = cl.ns
    k8s.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([sa_doc, role, bind]))
    try:
        kubeconfig = k8s.serviceaccount_kubeconfig(cl.ns, sa)
        # The token really is least-privileged: it cannot read Secrets.
        denied = k8s.kubectl("get", "secrets", "-n", cl.ns, kubeconfig=kubeconfig, check=False)
        assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
        monkeypatch.setenv("KUBECONFIG", kubeconfig)
        name = "rbac"
        with KopfRunner(RUN_ARGS, timeout=60) as runner:
            cl.apply(cr(name))
            cl.wait_ready(name, replicas=2)
            cl.patch(name, {"replicas": 1, "image": "example.org/nightjar-worker:3"})
            cl.wait_ready(name, replicas=1)
            assert {"Created", "Updated"} <= {e["reason"] for e in cl.events(name)}
            delete_and_wait(cl, name)
        assert_no_forbidden(runner.output)
        assert_clean(runner.output)
    finally:
        k8s.kubectl("delete", "clusterrolebinding,clusterrole", binding, "--ignore-not-found")


def test_a_namespace_being_deleted_is_left_alone(cl: Cluster):
    """A child removed while its namespace goes away: the reconcile does not try to re-create it in
    vain (the apiserver refuses with 403 NamespaceTerminating) and reports no error."""
    from nightjar_operator.handlers import sync as rec

    name = "going"
    cl.apply(cr(name, replicas=1))
    body = cl.njd(name)
    rec.reconcile(cl.api, body, trigger="test")
    assert cl.child("Deployment", name) is not None
    # A finalizer nobody removes keeps the CR, and so the namespace, in Terminating.
    cl.k8s.kubectl("patch", "njd", name, "-n", cl.ns, "--type", "merge", "-p",
                   json.dumps({"metadata": {"finalizers": ["test.nightjar.dev/hold"]}}))
    cl.api.request("DELETE", f"/apis/apps/v1/namespaces/{cl.ns}/deployments/{name}")
    cl.k8s.delete_namespace(cl.ns)
    wait_for(lambda: cl.api.request("GET", f"/api/v1/namespaces/{cl.ns}").get("status", {}).get("phase") == "Terminating",
             30, "namespace Terminating")
    wait_for(lambda: cl.child("Deployment", name) is None, 30, "the Deployment gone")
    def forbidden() -> float:
        return REGISTRY.get_sample_value("nightjar_operator_reconcile_errors_total", {"reason": "Forbidden"}) or 0.0

    before = forbidden()
    rec.reconcile(cl.api, cl.njd(name), trigger="test")  # raises on any error
    assert cl.child("Deployment", name) is None and forbidden() == before
    cl.k8s.kubectl("patch", "njd", name, "-n", cl.ns, "--type", "json", "-p",
                   json.dumps([{"op": "remove", "path": "/metadata/finalizers"}]))
