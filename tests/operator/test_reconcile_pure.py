"""Pure reconcile logic: desired children, desired-vs-live decisions, status and conditions."""

from __future__ import annotations

import copy
import subprocess
import sys

from nightjar_operator import constants as c
from nightjar_operator.reconcile import diff
from nightjar_operator.reconcile.children import (
    Owner,
    desired_children,
    desired_config_map,
    desired_deployment,
    desired_service,
    model_path,
)
from nightjar_operator.reconcile.config import engine_hash, live_priors
from nightjar_operator.reconcile.status import (
    Observed,
    compute_status,
    pod_problems,
    set_condition,
    status_patch,
)
from nightjar_operator.reconcile.validate import parse_spec

OWNER = Owner(name="demo", namespace="ns1", uid="uid-1")


def _spec(raw):
    spec, errs = parse_spec(raw)
    assert not errs, errs
    return spec


def _container(dep):
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return container


def _served(obj):
    """What the apiserver hands back: defaults filled in, quantities canonicalised, metadata added."""
    live = copy.deepcopy(obj)
    live["metadata"].update(resourceVersion="100", uid="child-uid", generation=1, creationTimestamp="2025-01-01T00:00:00Z")
    if obj["kind"] == "Deployment":
        pod = live["spec"]["template"]["spec"]
        pod.update(restartPolicy="Always", dnsPolicy="ClusterFirst", schedulerName="default-scheduler")
        for ctr in pod["containers"]:
            ctr.update(terminationMessagePath="/dev/termination-log", terminationMessagePolicy="File")
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                ctr[probe]["successThreshold"] = 1
            for section in ctr.get("resources", {}).values():
                for k, v in section.items():
                    if v == "0.5":
                        section[k] = "500m"
        pod["volumes"][0]["configMap"]["defaultMode"] = 420
        live["status"] = {"observedGeneration": 1}
    if obj["kind"] == "Service":
        live["spec"].update(clusterIP="10.0.0.12", clusterIPs=["10.0.0.12"], sessionAffinity="None")
    return live


# --------------------------------------------------------------------------------------- children
def test_deployment_shape(raw_spec):
    raw_spec["resources"] = {"gpus": 1, "requests": {"cpu": "0.5", "memory": "8Gi"}, "limits": {"memory": "16Gi"}}
    dep = desired_deployment(OWNER, _spec(raw_spec))
    ctr = _container(dep)
    pod = dep["spec"]["template"]["spec"]
    assert dep["metadata"]["ownerReferences"] == [OWNER.reference()]
    assert dep["metadata"]["ownerReferences"][0]["controller"] is True
    assert dep["spec"]["replicas"] == 2
    assert ctr["command"] == ["nightjar-worker", "serve"]
    args = ctr["args"]
    assert args[args.index("--model") + 1] == "/models/models/target"
    assert args[args.index("--draft") + 1] == "/models/models/draft"
    assert args[args.index("--config") + 1] == c.CONFIG_PATH
    assert ctr["resources"]["limits"][c.GPU_RESOURCE] == "1" == ctr["resources"]["requests"][c.GPU_RESOURCE]
    assert ctr["resources"]["requests"]["cpu"] == "0.5"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert ctr[probe]["httpGet"]["path"] == "/health" and ctr[probe]["httpGet"]["port"] == "http"
    assert ctr["securityContext"]["readOnlyRootFilesystem"] is True
    assert ctr["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    mounts = {m["mountPath"]: m["name"] for m in ctr["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in vols[mounts["/tmp"]]
    assert vols[mounts["/etc/nightjar"]]["configMap"]["name"] == "demo-config"
    assert vols[mounts["/etc/nightjar"]]["configMap"]["items"] == [{"key": "nightjar.yaml", "path": "nightjar.yaml"}]
    # One PVC shared by both models is mounted once, read-only.
    claims = [v["persistentVolumeClaim"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [{"claimName": "models", "readOnly": True}]
    # Selector: immutable, track-scoped; the pods carry it.
    sel = dep["spec"]["selector"]["matchLabels"]
    assert sel[c.LABEL_TRACK] == "stable"
    assert sel.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    # GPU pools cannot surge.
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_cpu_deployment_has_no_gpu(raw_spec):
    ctr = _container(desired_deployment(OWNER, _spec(raw_spec)))
    assert c.GPU_RESOURCE not in str(ctr["resources"])


def test_model_sources(raw_spec):
    raw_spec["target"]["source"] = {"uri": "hf://Qwen/Qwen2.5-7B-Instruct"}
    raw_spec["target"]["revision"] = "abc123"
    raw_spec["draft"]["source"] = {"imagePath": "/opt/models/draft"}
    spec = _spec(raw_spec)
    assert model_path(spec.target, "target") == "Qwen/Qwen2.5-7B-Instruct"
    assert model_path(spec.draft, "draft") == "/opt/models/draft"
    dep = desired_deployment(OWNER, spec)
    args = _container(dep)["args"]
    assert args[args.index("--revision") + 1] == "abc123"
    assert not any("persistentVolumeClaim" in v for v in dep["spec"]["template"]["spec"]["volumes"])
    assert "initContainers" not in dep["spec"]["template"]["spec"]


def test_hub_sources_get_revisions_token_endpoint_and_a_cache(raw_spec):
    raw_spec["target"].update(source={"uri": "hf://Qwen/Qwen2.5-7B-Instruct"}, revision="main")
    raw_spec["draft"].update(source={"uri": "hf://Qwen/Qwen2.5-0.5B-Instruct/"}, revision="a1b2c3")
    raw_spec["hub"] = {"tokenSecretRef": {"name": "hf-token"}, "endpoint": "https://hf-mirror.internal"}
    raw_spec["modelCache"] = {"sizeLimit": "40Gi"}
    pod = desired_deployment(OWNER, _spec(raw_spec))["spec"]["template"]["spec"]
    worker = _container({"spec": {"template": {"spec": pod}}})
    args = worker["args"]
    assert args[args.index("--draft") + 1] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert args[args.index("--revision") + 1] == "main" and args[args.index("--draft-revision") + 1] == "a1b2c3"
    env = {e["name"]: e for e in worker["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}
    assert env["HF_ENDPOINT"]["value"] == "https://hf-mirror.internal"
    assert env["HF_HOME"]["value"].startswith(c.CACHE_DIR)
    assert {"name": "cache", "emptyDir": {"sizeLimit": "40Gi"}} in pod["volumes"]
    raw_spec["modelCache"] = {"claimName": "hf-cache"}
    pod = desired_deployment(OWNER, _spec(raw_spec))["spec"]["template"]["spec"]
    assert {"name": "cache", "persistentVolumeClaim": {"claimName": "hf-cache"}} in pod["volumes"]
    assert "HF_TOKEN" not in str(desired_deployment(OWNER, _spec({**raw_spec, "hub": {}})))


def test_image_source_copies_the_model_in_an_init_container(raw_spec):
    image = "ghcr.io/nightjar-dev/nightjar-models:smollm2-135m"
    raw_spec["draft"]["source"] = {"image": {"reference": image, "path": "smollm2-135m-draft/"}}
    spec = _spec(raw_spec)
    pod = desired_deployment(OWNER, spec)["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]  # the target stays on its PVC
    assert init["name"] == "model-draft" and init["image"] == image
    env = {e["name"]: e["value"] for e in init["env"]}
    assert env["SRC"] == "/models/smollm2-135m-draft" and env["DST"] == "/mnt/oci-models/draft"
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    worker = _container({"spec": {"template": {"spec": pod}}})
    args = worker["args"]
    assert args[args.index("--draft") + 1] == "/models/oci/draft"
    mount = next(m for m in worker["volumeMounts"] if m["name"] == "oci-models")
    assert mount == {"name": "oci-models", "mountPath": "/models/oci", "readOnly": True}
    assert {"name": "oci-models", "emptyDir": {}} in pod["volumes"]
    # The same files at another path, or another image, are another model.
    other = _spec({**raw_spec, "draft": {**raw_spec["draft"], "source": {"image": {"reference": image, "path": "x"}}}})
    assert other.draft.source.location() != spec.draft.source.location()


def test_image_source_rejects_a_bad_reference(raw_spec):
    raw_spec["draft"]["source"] = {"image": {"reference": "Not An Image"}}
    spec, errs = parse_spec(raw_spec)
    assert spec is None and any("draft.source.image.reference" in str(e) for e in errs), errs


def _pod(name, *, init=(), containers=(), unschedulable=None, env=()):
    st = {"initContainerStatuses": list(init), "containerStatuses": list(containers)}
    if unschedulable:
        st["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}]
    return {"metadata": {"name": name}, "status": st, "spec": {"containers": [{"name": "worker", "env": list(env)}]}}


def _secret_env(var, secret):
    return {"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}}


def test_pod_problems_name_pod_container_and_cause():
    missing = {"name": "model-draft", "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
               "lastState": {"terminated": {"exitCode": 2, "reason": "Error",
                                            "message": "model image x has no /models/d/config.json\n"}}}
    pull = {"name": "worker", "state": {"waiting": {"reason": "ErrImageNeverPull", "message": "image y not present"}}}
    token = {"name": "worker", "state": {"waiting": {"reason": "CreateContainerConfigError",
                                                    "message": 'secret "hf-token" not found'}}}
    starting = {"name": "worker", "state": {"waiting": {"reason": "ContainerCreating"}}}
    oom = {"name": "worker", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
           "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
    api_key = {"name": "worker", "state": {"waiting": {"reason": "CreateContainerConfigError",
                                                      "message": "couldn't find key k in Secret ns/api-key"}}}
    both = [_secret_env("HF_TOKEN", "hf-token"), _secret_env("VLLM_API_KEY", "api-key")]
    pods = [_pod("a", init=[missing]), _pod("b", containers=[pull]), _pod("c", containers=[starting]),
            _pod("d", unschedulable="0/1 nodes: Insufficient nvidia.com/gpu"), _pod("g", containers=[token], env=both),
            _pod("h", containers=[api_key], env=both)]
    got = pod_problems(pods)
    assert got == [
        "pod a init container model-draft (spec.draft.source.image): CrashLoopBackOff"
        " (exit code 2: model image x has no /models/d/config.json)",
        "pod b container worker: ErrImageNeverPull (image y not present)",
        "pod d: unschedulable: 0/1 nodes: Insufficient nvidia.com/gpu",
        'pod g container worker (spec.hub.tokenSecretRef): CreateContainerConfigError (secret "hf-token" not found)',
        "pod h container worker (spec.auth.apiKeySecretRef): CreateContainerConfigError"
        " (couldn't find key k in Secret ns/api-key)",
    ]
    status = compute_status({"metadata": {"name": "n", "generation": 1}, "spec": {}},
                            Observed(deployment=None, pod_problems=got), now="t")
    degraded = next(x for x in status["conditions"] if x["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "PodFailing" and "pod a init container" in degraded["message"]
    assert pod_problems([_pod("e", containers=[starting])]) == []
    assert pod_problems([_pod("f", containers=[oom])]) == ["pod f container worker: CrashLoopBackOff (exit code 137 OOMKilled)"]


def test_service_selects_all_tracks(raw_spec):
    svc = desired_service(OWNER)
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert c.LABEL_TRACK not in svc["spec"]["selector"]
    pod_labels = desired_deployment(OWNER, _spec(raw_spec))["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()


def test_config_map_is_a_valid_worker_config(raw_spec):
    from nightjar_contract.runtime import parse_runtime_config_text

    raw_spec["speculation"] = {"maxGamma": 6, "arms": [0, 2, 6], "switchingCostMs": 12.5}
    raw_spec["slo"] = {"tpotP95Ms": 80, "ttftP95Ms": 900}
    cm = desired_config_map(OWNER, _spec(raw_spec))
    cfg = parse_runtime_config_text(cm["data"]["nightjar.yaml"])
    assert cfg.planner.max_gamma == 6 and cfg.planner.arms == [0, 2, 6]
    assert abs(cfg.planner.switch_cost_s - 0.0125) < 1e-12
    assert cfg.slo.tpot_p95_ms == 80 and cfg.tpot_target_s() == 0.08
    assert cfg.slo.attainment == 0.99  # the CRD's default, the planner's objective is for it


def test_priors_are_carried_over_and_do_not_change_the_hash(raw_spec):
    spec = _spec(raw_spec)
    priors = {"bucket_edges": [1, 2, 4], "entries": [{"bucket_lo": 2, "gamma": 3, "mean_loss_s": 0.02, "count": 5.0}]}
    plain = desired_config_map(OWNER, spec)
    warm = desired_config_map(OWNER, spec, priors)
    assert live_priors(warm["data"]["nightjar.yaml"]) == priors
    assert warm["metadata"]["annotations"] == plain["metadata"]["annotations"]
    # A live ConfigMap with priors is in sync with a desired one built from those priors.
    assert diff.plan(warm, _served(warm), OWNER.uid) is diff.Action.NONE


def test_engine_hash_rolls_pods_only_for_restart_fields(raw_spec):
    base = engine_hash(_spec(raw_spec))
    raw_spec["speculation"] = {"switchingCostMs": 3}
    raw_spec["slo"] = {"tpotP95Ms": 50}
    assert engine_hash(_spec(raw_spec)) == base  # applied live through the ConfigMap
    raw_spec["speculation"] = {"maxGamma": 6}
    assert engine_hash(_spec(raw_spec)) != base


# ------------------------------------------------------------------------------------------- diff
def test_served_objects_are_in_sync(raw_spec):
    raw_spec["resources"] = {"requests": {"cpu": "0.5"}}
    for obj in desired_children(OWNER, _spec(raw_spec)):
        assert diff.plan(obj, _served(obj), OWNER.uid) is diff.Action.NONE, obj["kind"]


def test_missing_child_is_created(raw_spec):
    dep = desired_deployment(OWNER, _spec(raw_spec))
    assert diff.plan(dep, None, OWNER.uid) is diff.Action.CREATE


def test_drift_and_removals_are_updates(raw_spec):
    spec = _spec(raw_spec)
    dep = desired_deployment(OWNER, spec)
    live = _served(dep)
    live["spec"]["replicas"] = 7  # someone scaled the Deployment by hand
    assert diff.plan(dep, live, OWNER.uid) is diff.Action.UPDATE
    assert "spec.replicas" in diff.differences(dep, live)
    # Going from 1 GPU to none only removes keys: the subset test alone would miss it, the hash does not.
    raw_spec["resources"] = {"gpus": 1}
    with_gpu = _served(desired_deployment(OWNER, _spec(raw_spec)))
    assert diff.is_subset(dep["spec"]["template"]["spec"]["containers"][0]["resources"],
                          with_gpu["spec"]["template"]["spec"]["containers"][0]["resources"])  # fmt: skip
    assert diff.plan(dep, with_gpu, OWNER.uid) is diff.Action.UPDATE


def test_update_body_replaces_spec_and_keeps_server_fields():
    svc = desired_service(OWNER)
    live = _served(svc)
    live["metadata"]["labels"]["team"] = "ml"
    live["metadata"]["annotations"]["note"] = "kept"
    body = diff.update_body(svc, live)
    assert body["metadata"]["resourceVersion"] == "100"
    assert body["spec"]["clusterIP"] == "10.0.0.12"
    assert body["metadata"]["labels"]["team"] == "ml" and body["metadata"]["annotations"]["note"] == "kept"
    assert body["metadata"]["ownerReferences"] == [OWNER.reference()]


def test_foreign_children_are_never_taken_over(raw_spec):
    dep = desired_deployment(OWNER, _spec(raw_spec))
    foreign = _served(dep)
    foreign["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "uid": "other", "controller": True}
    ]
    assert diff.plan(dep, foreign, OWNER.uid) is diff.Action.CONFLICT
    # The same NightjarDeployment recreated (new uid) adopts its predecessor's children.
    stale = _served(dep)
    stale["metadata"]["ownerReferences"] = [{**OWNER.reference(), "uid": "old-uid"}]
    assert diff.plan(dep, stale, OWNER.uid) is diff.Action.UPDATE
    assert diff.update_body(dep, stale)["metadata"]["ownerReferences"] == [OWNER.reference()]


def test_quantities_compare_by_value():
    assert diff.parse_quantity("500m") == diff.parse_quantity("0.5") == diff.parse_quantity(0.5)
    assert diff.parse_quantity("1Gi") == diff.parse_quantity(str(2**30))
    assert diff.parse_quantity("1e3") == diff.parse_quantity("1k")
    assert diff.parse_quantity("lots") is None
    assert diff.is_subset({"limits": {"cpu": "1000m"}}, {"limits": {"cpu": "1"}})
    assert not diff.is_subset({"image": "1"}, {"image": "1.0"})  # only resource maps are quantities


# ----------------------------------------------------------------------------------------- status
def _body(status=None, generation=3, replicas=2):
    return {
        "metadata": {"name": "demo", "namespace": "ns1", "uid": "uid-1", "generation": generation},
        "spec": {"replicas": replicas},
        "status": status or {},
    }


def _dep(replicas=2, ready=2, updated=2, gen=5, observed=5, conditions=()):
    return {
        "metadata": {"generation": gen, "annotations": {c.ANN_TARGET: "T", c.ANN_DRAFT: "D"}},
        "spec": {"replicas": replicas},
        "status": {"observedGeneration": observed, "replicas": replicas, "readyReplicas": ready,
                   "updatedReplicas": updated, "conditions": list(conditions)},
    }  # fmt: skip


def _cond(status, ctype):
    return next(x for x in status["conditions"] if x["type"] == ctype)


def test_status_ready_and_idempotent():
    st = compute_status(_body(), Observed(deployment=_dep()), now="2025-01-01T00:00:00Z")
    ready = _cond(st, "Ready")
    assert ready["status"] == "True" and ready["reason"] == "AllReplicasReady" and ready["observedGeneration"] == 3
    assert _cond(st, "Progressing")["status"] == "False"
    assert _cond(st, "Degraded")["status"] == "False"
    assert _cond(st, "SLOMet")["status"] == "Unknown"
    assert st["observedGeneration"] == 3 and st["readyReplicas"] == 2 and st["target"] == "T" and st["draft"] == "D"
    assert st["selector"] == "app.kubernetes.io/name=nightjar-worker,nightjar.dev/deployment=demo"
    again = compute_status(_body(st), Observed(deployment=_dep()), now="2025-01-02T00:00:00Z")
    assert status_patch(st, again) is None  # nothing changed: nothing to write, times kept


def test_status_rolling_out_then_ready_moves_transition_time():
    st = compute_status(_body(), Observed(deployment=_dep(ready=1, updated=1)), now="2025-01-01T00:00:00Z")
    assert _cond(st, "Ready")["status"] == "False" and _cond(st, "Progressing")["reason"] == "RollingOut"
    st2 = compute_status(_body(st), Observed(deployment=_dep()), now="2025-01-01T00:05:00Z")
    assert _cond(st2, "Ready")["lastTransitionTime"] == "2025-01-01T00:05:00Z"
    assert _cond(st2, "Degraded")["lastTransitionTime"] == "2025-01-01T00:00:00Z"  # unchanged status


def test_status_unobserved_generation_is_not_ready():
    st = compute_status(_body(), Observed(deployment=_dep(gen=6, observed=5)))
    assert _cond(st, "Ready")["status"] == "False"


def test_status_invalid_spec_keeps_replica_counts():
    st = compute_status(_body(), Observed(deployment=_dep(), invalid=["spec.draft.source: must differ"]))
    ready = _cond(st, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.draft.source" in ready["message"]
    assert st["readyReplicas"] == 2  # the old workers keep serving


def test_status_degraded_on_progress_deadline():
    stuck = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "too slow"}
    st = compute_status(_body(), Observed(deployment=_dep(ready=0, updated=2, conditions=[stuck])))
    assert _cond(st, "Degraded")["status"] == "True" and _cond(st, "Degraded")["reason"] == "ProgressDeadlineExceeded"


def test_status_scaled_to_zero_and_foreign_fields_kept():
    foreign = {"fleet": {"x": 1}, "conditions": [
        {"type": "SLOMet", "status": "True", "reason": "Met", "message": "p95 ok", "lastTransitionTime": "t0"},
        {"type": "Custom", "status": "True", "reason": "X", "message": "", "lastTransitionTime": "t0"},
    ]}  # fmt: skip
    st = compute_status(_body(foreign, replicas=0), Observed(deployment=_dep(replicas=0, ready=0, updated=0)))
    assert _cond(st, "Ready")["reason"] == "ScaledToZero"
    assert _cond(st, "SLOMet")["reason"] == "Met" and _cond(st, "Custom")["reason"] == "X"
    assert st["fleet"] == {"x": 1}
    assert [x["type"] for x in st["conditions"]] == ["Ready", "Progressing", "Degraded", "SLOMet", "ElasticMemory", "Custom"]


def test_set_condition_transition_rules():
    conds = set_condition([], "Ready", "False", "Creating", "", 1, "t1")
    conds = set_condition(conds, "Ready", "False", "RollingOut", "x", 2, "t2")
    assert conds[0]["lastTransitionTime"] == "t1" and conds[0]["reason"] == "RollingOut"
    conds = set_condition(conds, "Ready", "True", "AllReplicasReady", "", 2, "t3")
    assert conds[0]["lastTransitionTime"] == "t3" and len(conds) == 1


# --------------------------------------------------------------------------------- import hygiene
def test_operator_never_imports_the_engine(raw_spec):
    code = (
        "import sys, nightjar_operator.main\n"
        "from nightjar_operator.reconcile.validate import parse_spec, semantic_errors\n"
        "from nightjar_operator.reconcile.children import Owner, desired_children\n"
        f"spec, _ = parse_spec({raw_spec!r})\n"
        "assert not semantic_errors(spec)\n"
        "desired_children(Owner('a', 'b', 'c'), spec)\n"
        "bad = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
