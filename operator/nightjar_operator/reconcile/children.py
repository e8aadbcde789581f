"""Desired child objects (Deployment, Service, ConfigMap) of one NightjarDeployment. Pure functions.

Every child carries the owner reference (garbage collection on delete), the common labels, and
``nightjar.dev/desired-hash``: the hash of what the operator means the object to be, so a spec
change that only *removes* something (which a subset comparison cannot see) still triggers an
update. A model given as an image is copied into the pod by an init container (modelcar layout).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nightjar_contract.engine import RUNNER_ENV, RUNNER_ENV_VALUE
from nightjar_contract.memory import ElasticMemoryConfig

from nightjar_operator import constants as c
from nightjar_operator.crd.models import ModelRef, NightjarDeploymentSpec
from nightjar_operator.reconcile.config import engine_hash, render_runtime_config, runtime_config_dict


@dataclass(frozen=True)
class Owner:
    """The NightjarDeployment the children belong to."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def from_body(cls, body: Any) -> Owner:
        meta = body["metadata"]
        return cls(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def common_labels(name: str) -> dict[str, str]:
    return {
        c.LABEL_NAME: c.WORKER_APP,
        c.LABEL_INSTANCE: name,
        c.LABEL_COMPONENT: "worker",
        c.LABEL_MANAGED_BY: c.OPERATOR_NAME,
        c.LABEL_DEPLOYMENT: name,
    }


def service_selector(name: str) -> dict[str, str]:
    """All worker pods of the NightjarDeployment (stable and, during a rollout, candidate)."""
    return {c.LABEL_NAME: c.WORKER_APP, c.LABEL_DEPLOYMENT: name}


def pod_selector(name: str, track: str = c.TRACK_STABLE) -> dict[str, str]:
    """One Deployment's pods (its immutable selector)."""
    return {**service_selector(name), c.LABEL_TRACK: track}


def selector_string(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def stable_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:20]


def _with_hash(obj: dict[str, Any], basis: Any = None) -> dict[str, Any]:
    """Stamp ``desired-hash`` computed over ``basis`` (default: the object itself)."""
    h = stable_hash(obj if basis is None else basis)
    obj["metadata"].setdefault("annotations", {})[c.ANN_DESIRED_HASH] = h
    return obj


def _meta(owner: Owner, name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": owner.namespace,
        "labels": common_labels(owner.name),
        "ownerReferences": [owner.reference()],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


# ------------------------------------------------------------------------------------------ models
def _claims(spec: NightjarDeploymentSpec) -> list[str]:
    return sorted({m.source.pvc.claim_name for m in (spec.target, spec.draft) if m.source.pvc is not None})


# Model images are copied into this volume by one init container per model (role: target, draft).
OCI_VOLUME = "oci-models"
OCI_MOUNT = f"{c.MODELS_DIR}/oci"
_COPY_TO = "/mnt/oci-models"
# The init container's script: a clear error when the image lacks the model, then an atomic copy
# (a copy cut short by a restart never looks complete). Its last log lines become the container's
# termination message (FallbackToLogsOnError), which the operator reports in the Degraded condition.
_COPY_SCRIPT = (
    'if [ ! -f "$SRC/config.json" ]; then '
    'echo "model image $IMAGE has no $SRC/config.json: expected a model directory under /models '
    '(modelcar layout); $(dirname "$SRC") holds: $(ls "$(dirname "$SRC")" 2>&1 | head -20 | tr -s "\\n" " ")" >&2; '
    "exit 2; fi; "
    'rm -rf "$DST.partial" && cp -r "$SRC" "$DST.partial" && rm -rf "$DST" && mv "$DST.partial" "$DST" '
    '&& echo "copied $IMAGE:$SRC to $DST ($(du -sh "$DST" | cut -f1))"'
)


def _model_roles(spec: NightjarDeploymentSpec) -> list[tuple[str, ModelRef]]:
    return [("target", spec.target), ("draft", spec.draft)]


def _shift(key: str, own: int) -> Callable[[re.Match[str]], str]:
    """A ``re.sub`` replacement: index i of the pod's list is the user's i - own (ours come first)."""
    return lambda m: f"spec.pod.{key}[{int(m.group(1)) - own}]"


# Worker env variables read from a Secret the spec names: the one place that says which field gives
# which variable (the env is built from it, and a missing Secret is reported against the field).
SECRET_ENV_FIELDS = {"HF_TOKEN": "spec.hub.tokenSecretRef", "VLLM_API_KEY": "spec.auth.apiKeySecretRef"}


def secret_env(spec: NightjarDeploymentSpec) -> list[dict[str, Any]]:
    """HF_TOKEN (Hub downloads) and VLLM_API_KEY (vLLM's own bearer check on /v1) from their Secrets.
    A missing Secret or key keeps the container in CreateContainerConfigError (no crash loop), and
    pod_problems names the field (spec_field_of)."""
    refs = {"HF_TOKEN": spec.hub.token_secret_ref, "VLLM_API_KEY": spec.auth.api_key_secret_ref}
    return [{"name": var, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
            for var, ref in refs.items() if ref is not None]


def spec_field_of(container: str, message: str = "", env: list[dict[str, Any]] | None = None) -> str | None:
    """The spec field behind a container's failure, for error messages: a model init container's
    image, or the Secret the worker's env cannot be built without (the kubelet says ``secret "x" not
    found`` / ``couldn't find key K in Secret ns/x``), found through the container's ``env``."""
    role = container.removeprefix("model-")
    if container.startswith("model-") and role in ("target", "draft"):
        return f"spec.{role}.source.image"
    if container != "worker" or "secret" not in message.lower():
        return None
    fields = []
    for var in env or []:
        ref = (var.get("valueFrom") or {}).get("secretKeyRef") or {}
        name = ref.get("name")
        if var.get("name") in SECRET_ENV_FIELDS and name and (f'"{name}"' in message or f"/{name}" in message):
            fields.append(SECRET_ENV_FIELDS[var["name"]])
    return ", ".join(dict.fromkeys(fields)) or None


def model_init_containers(spec: NightjarDeploymentSpec, security: dict[str, Any]) -> list[dict[str, Any]]:
    """One init container per model whose source is an image (the modelcar convention)."""
    out = []
    for role, model in _model_roles(spec):
        img = model.source.image
        if img is None:
            continue
        out.append({
            "name": f"model-{role}",
            "image": img.reference,
            "imagePullPolicy": img.pull_policy,
            "command": ["sh", "-c", _COPY_SCRIPT],
            "env": [
                {"name": "IMAGE", "value": img.reference},
                {"name": "SRC", "value": img.directory()},
                {"name": "DST", "value": f"{_COPY_TO}/{role}"},
            ],
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
            "securityContext": security,
            "volumeMounts": [{"name": OCI_VOLUME, "mountPath": _COPY_TO}],
        })
    return out


def model_path(model: ModelRef, role: str) -> str:
    """What the worker gets as ``--model`` (role target) / ``--draft`` (role draft)."""
    src = model.source
    if src.image is not None:
        return f"{OCI_MOUNT}/{role}"
    if src.pvc is not None:
        sub = src.pvc.path.strip("/")
        base = f"{c.MODELS_DIR}/{src.pvc.claim_name}"
        return f"{base}/{sub}" if sub else base
    if src.uri is not None:
        # vLLM downloads Hub repo ids itself (validate.py refuses every other scheme).
        return src.uri.removeprefix("hf://").rstrip("/")
    assert src.image_path is not None
    return src.image_path


def _memory_env(spec: NightjarDeploymentSpec) -> str:
    """JSON for the worker's ``ElasticMemoryConfig`` (env ``NIGHTJAR_MEMORY``; only what the spec sets)."""
    off = spec.speculation.offload
    policy: dict[str, Any] = {}
    if off.kv_usage_high is not None:
        policy["kv_usage_high"] = off.kv_usage_high
    if off.kv_usage_low is not None:
        policy["kv_usage_low"] = off.kv_usage_low
    if off.recheck_after_seconds is not None:
        policy["recheck_after_s"] = off.recheck_after_seconds or None
    doc: dict[str, Any] = {"enabled": off.policy == "Auto", "policy": policy}
    if off.allow_unverified_cuda:
        doc["allow_unverified_cuda"] = True
    ElasticMemoryConfig.model_validate(doc)  # the worker's model: a bad threshold fails here, named
    return json.dumps(doc, sort_keys=True)


# ------------------------------------------------------------------------------------- deployment
def rolling_strategy(spec: NightjarDeploymentSpec) -> dict[str, int]:
    """Never below the replicas that serve now: a single replica is replaced surge-first (its
    successor must be Ready before it goes; on a GPU that needs a spare GPU, else the rollout waits
    and the old pod keeps serving). Larger GPU pools replace one pod at a time in place (a surge pod
    would need a spare GPU); CPU pools surge."""
    if spec.replicas <= 1 or spec.resources.gpus == 0:
        return {"maxSurge": 1, "maxUnavailable": 0}
    return {"maxSurge": 0, "maxUnavailable": 1}


def worker_args(spec: NightjarDeploymentSpec) -> list[str]:
    args = ["--model", model_path(spec.target, "target"), "--draft", model_path(spec.draft, "draft")]
    # The worker binds loopback by default; in a pod the kubelet probes and the Service need all interfaces.
    args += ["--config", c.CONFIG_PATH, "--host", "0.0.0.0", "--port", str(c.HTTP_PORT)]
    if spec.target.source.uri is not None and spec.target.revision:
        args += ["--revision", spec.target.revision]
    if spec.draft.source.uri is not None and spec.draft.revision:
        args += ["--draft-revision", spec.draft.revision]
    # On SIGTERM vLLM stops admitting and lets running requests finish for this long (then aborts).
    args += ["--shutdown-timeout", str(spec.drain.drain_seconds)]
    # The device is told, not probed: the worker's API server process then never touches CUDA
    # before vLLM forks its engine core (serve.py).
    args += ["--device", "cuda" if spec.resources.gpus > 0 else "cpu"]
    return args + list(spec.vllm_args)


def _env(spec: NightjarDeploymentSpec, name: str) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "NIGHTJAR_CONFIG", "value": c.CONFIG_PATH},
        {"name": "NIGHTJAR_STATE_DIR", "value": "/tmp/nightjar"},
        {"name": "NIGHTJAR_DEPLOYMENT", "value": name},
        {"name": "NIGHTJAR_TARGET_NAME", "value": spec.target.name},
        {"name": "NIGHTJAR_DRAFT_NAME", "value": spec.draft.name},
        {"name": "NIGHTJAR_MEMORY", "value": _memory_env(spec)},
        # vLLM's V1 model runner, the one the worker's hooks are on (the worker refuses V2)
        {"name": RUNNER_ENV, "value": RUNNER_ENV_VALUE},
        {"name": "HOME", "value": "/tmp"},
        {"name": "HF_HOME", "value": f"{c.CACHE_DIR}/hf"},
        {"name": "VLLM_CACHE_ROOT", "value": f"{c.CACHE_DIR}/vllm"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
    ]
    env += secret_env(spec)
    if spec.hub.endpoint:
        env.append({"name": "HF_ENDPOINT", "value": spec.hub.endpoint})
    if spec.target.revision:
        env.append({"name": "NIGHTJAR_TARGET_REVISION", "value": spec.target.revision})
    if spec.draft.revision:
        env.append({"name": "NIGHTJAR_DRAFT_REVISION", "value": spec.draft.revision})
    return env


def _resources(spec: NightjarDeploymentSpec) -> dict[str, Any]:
    res = spec.resources
    requests = res.requests.k8s() if res.requests else {}
    limits = res.limits.k8s() if res.limits else {}
    if res.gpus > 0:
        # Extended resources: request must equal limit.
        requests[res.accelerator_resource] = str(res.gpus)
        limits[res.accelerator_resource] = str(res.gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def cache_volume(spec: NightjarDeploymentSpec) -> dict[str, Any]:
    """HF_HOME and vLLM's caches: survives container restarts (emptyDir) or the pod (a PVC)."""
    mc = spec.model_cache
    if mc.claim_name:
        return {"name": "cache", "persistentVolumeClaim": {"claimName": mc.claim_name}}
    return {"name": "cache", "emptyDir": {"sizeLimit": str(mc.size_limit)} if mc.size_limit is not None else {}}


def _probe(period: int, failures: int, timeout: int = 1) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": "http", "scheme": "HTTP"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


# What the operator itself puts in a worker pod: pod overrides may not take these (validate.py).
OWN_VOLUMES = frozenset({"config", "tmp", "cache", "shm", OCI_VOLUME})
OWN_MOUNT_DIRS = (c.CONFIG_DIR, "/tmp", c.CACHE_DIR, "/dev/shm", c.MODELS_DIR)
OWN_ENV_PREFIXES = ("NIGHTJAR_", "HF_", "VLLM_", "PROMETHEUS_")
OWN_ENV = frozenset({"HOME", "POD_NAME", "POD_NAMESPACE"})


def apply_pod_overrides(name: str, spec: NightjarDeploymentSpec, pod: dict[str, Any], container: dict[str, Any]) -> None:
    """Merge spec.pod into a worker pod spec and its container (in place). The operator's own env,
    volumes and mounts come first and validate.py refuses overrides that would shadow them."""
    o = spec.pod
    for key, val in (("nodeSelector", o.node_selector), ("runtimeClassName", o.runtime_class_name),
                     ("priorityClassName", o.priority_class_name), ("serviceAccountName", o.service_account_name),
                     ("affinity", o.affinity)):
        if val:
            pod[key] = val
    if o.tolerations:
        pod["tolerations"] = [t.wire() for t in o.tolerations]
    if o.topology_spread_constraints:
        # Without a selector a constraint counts no pods at all: default to this pool's workers.
        pod["topologySpreadConstraints"] = [
            {"labelSelector": {"matchLabels": service_selector(name)}, **tsc} for tsc in o.topology_spread_constraints]
    if o.image_pull_secrets:
        pod["imagePullSecrets"] = [r.wire() for r in o.image_pull_secrets]
    if o.volumes:
        pod["volumes"] = pod["volumes"] + list(o.volumes)
    if o.env:
        container["env"] = container["env"] + [e.wire() for e in o.env]
    if o.env_from:
        container["envFrom"] = [e.wire() for e in o.env_from]
    if o.volume_mounts:
        container["volumeMounts"] = container["volumeMounts"] + [m.wire() for m in o.volume_mounts]


def override_field(path: str, pod: dict[str, Any]) -> str:
    """The spec.pod field behind an apiserver error on a rendered Deployment field (as the 422's
    causes name it), e.g. spec.template.spec.volumes[6].hostPath -> spec.pod.volumes[1].hostPath."""
    import re

    own_volumes = sum(1 for v in pod.get("volumes", []) if v["name"] in OWN_VOLUMES or v["name"].startswith("model-"))
    ctr = pod["containers"][0]
    own_env = sum(1 for e in ctr.get("env", []) if e["name"] in OWN_ENV or e["name"].startswith(OWN_ENV_PREFIXES))
    own_mounts = sum(1 for m in ctr.get("volumeMounts", []) if m["name"] in OWN_VOLUMES or m["name"].startswith("model-"))
    p = path.replace("spec.template.spec.containers[0].", "spec.pod.").replace("spec.template.spec.", "spec.pod.")
    for key, own in (("volumes", own_volumes), ("env", own_env), ("volumeMounts", own_mounts)):
        p = re.sub(rf"spec\.pod\.{key}\[(\d+)\]", _shift(key, own), p)
    return p


def desired_deployment(owner: Owner, spec: NightjarDeploymentSpec) -> dict[str, Any]:
    name = owner.name
    dr = spec.drain
    pod_labels = {**(spec.pod.labels or {}), **common_labels(name), c.LABEL_TRACK: c.TRACK_STABLE}
    pair = {c.ANN_TARGET: spec.target.name, c.ANN_DRAFT: spec.draft.name}
    claims = _claims(spec)
    mounts = [
        {"name": "config", "mountPath": c.CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": c.CACHE_DIR},
        {"name": "shm", "mountPath": "/dev/shm"},
    ] + [{"name": f"model-{i}", "mountPath": f"{c.MODELS_DIR}/{claim}", "readOnly": True} for i, claim in enumerate(claims)]
    security = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    init = model_init_containers(spec, security)
    if init:
        mounts.append({"name": OCI_VOLUME, "mountPath": OCI_MOUNT, "readOnly": True})
    volumes = [
        # No subPath: kubelet then swaps the file in place when the ConfigMap changes (live reload).
        {"name": "config", "configMap": {"name": c.config_map_name(name), "items": [{"key": c.CONFIG_KEY, "path": c.CONFIG_KEY}]}},
        {"name": "tmp", "emptyDir": {}},
        cache_volume(spec),
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ] + [
        {"name": f"model-{i}", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        for i, claim in enumerate(claims)
    ] + ([{"name": OCI_VOLUME, "emptyDir": {}}] if init else [])
    container = {
        "name": "worker",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["nightjar-worker", "serve"],
        "args": worker_args(spec),
        "ports": [{"name": "http", "containerPort": c.HTTP_PORT, "protocol": "TCP"}],
        "env": _env(spec, name),
        "resources": _resources(spec),
        # Model loading can take many minutes: the startup probe holds liveness off until /health answers.
        "startupProbe": _probe(period=10, failures=180),
        "readinessProbe": _probe(period=5, failures=3),
        "livenessProbe": _probe(period=15, failures=4, timeout=5),
        "securityContext": security,
        "volumeMounts": mounts,
        # The kubelet runs preStop before SIGTERM: the pod is already out of the Service's endpoints,
        # and the delay lets every proxy notice before vLLM stops accepting (it then drains).
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(dr.pre_stop_delay_seconds)]}}},
    }
    strategy = rolling_strategy(spec)
    obj: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(owner, c.deployment_name(name), pair),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": pod_selector(name)},
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": 1800,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": strategy},
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    "annotations": {
                        **(spec.pod_annotations or {}),
                        **(spec.pod.annotations or {}),
                        **pair,
                        c.ANN_ENGINE_HASH: engine_hash(spec),
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(c.HTTP_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "automountServiceAccountToken": False,  # workers never talk to the API
                    "enableServiceLinks": False,
                    # preStop delay + vLLM's drain + time to exit; past it the kubelet kills.
                    "terminationGracePeriodSeconds": dr.pre_stop_delay_seconds + dr.drain_seconds + 15,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": c.WORKER_UID,
                        "runAsGroup": c.WORKER_UID,
                        "fsGroup": c.WORKER_UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    **({"initContainers": init} if init else {}),
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }
    apply_pod_overrides(name, spec, obj["spec"]["template"]["spec"], container)
    return _with_hash(obj)


# ---------------------------------------------------------------------------------------- service
def desired_service(owner: Owner, name: str | None = None, selector: dict[str, str] | None = None) -> dict[str, Any]:
    """The workers' Service (every pod of both revisions); ``name`` and ``selector`` make one for a
    single revision (spec.routing's HTTPRoute backends)."""
    obj = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, name or c.service_name(owner.name)),
        "spec": {
            "type": "ClusterIP",
            "selector": selector or service_selector(owner.name),
            "ports": [{"name": "http", "port": c.HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    return _with_hash(obj)


# -------------------------------------------------------------------------------------- configmap
def desired_config_map(owner: Owner, spec: NightjarDeploymentSpec, priors: Any = None) -> dict[str, Any]:
    obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(owner, c.config_map_name(owner.name)),
        "data": {c.CONFIG_KEY: render_runtime_config(spec, priors)},
    }
    # The hash leaves out the fleet loop's priors: a new push of priors is not a spec change.
    basis = {"metadata": obj["metadata"], "config": runtime_config_dict(spec)}
    return _with_hash(obj, basis)


def desired_pdb(owner: Owner, spec: NightjarDeploymentSpec, api_version: str = "policy/v1") -> dict[str, Any] | None:
    """The pool's PodDisruptionBudget, or None when there should be none (see DisruptionBudgetSpec)."""
    db = spec.disruption_budget
    if not (db.enabled if db.enabled is not None else spec.replicas > 1):
        return None
    obj = {
        "apiVersion": api_version,
        "kind": "PodDisruptionBudget",
        "metadata": _meta(owner, c.pdb_name(owner.name)),
        # Every worker of the pool, stable and candidate: a drain must not take more of them at once.
        "spec": {"maxUnavailable": db.max_unavailable, "selector": {"matchLabels": service_selector(owner.name)}},
    }
    return _with_hash(obj)


NETWORK_POLICY_VERSION = "networking.k8s.io/v1"


def desired_network_policy(owner: Owner, spec: NightjarDeploymentSpec,
                           operator_peers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """spec.networkPolicy: ingress to the worker port from the spec's peers and ``operator_peers``
    (the operator, whose fleet loop scrapes /metrics, and what the chart adds, e.g. Prometheus), or
    None when it is off. Every worker pod of the pool is selected, candidate ones included."""
    np = spec.network_policy
    if not np.enabled:
        return None
    peers = [dict(p) for p in operator_peers] + [p.wire() for p in np.from_]
    # A rule with no peers would admit every source: with none, the policy admits nothing.
    ingress = [{"from": peers, "ports": [{"protocol": "TCP", "port": c.HTTP_PORT}]}] if peers else []
    obj = {
        "apiVersion": NETWORK_POLICY_VERSION,
        "kind": "NetworkPolicy",
        "metadata": _meta(owner, owner.name),
        "spec": {"podSelector": {"matchLabels": service_selector(owner.name)}, "policyTypes": ["Ingress"],
                 "ingress": ingress},
    }
    return _with_hash(obj)


def desired_children(owner: Owner, spec: NightjarDeploymentSpec, priors: Any = None,
                     pdb_api_version: str = "policy/v1") -> list[dict[str, Any]]:
    """In apply order: the ConfigMap first so a new pod never waits on a missing volume."""
    out = [desired_config_map(owner, spec, priors), desired_deployment(owner, spec), desired_service(owner)]
    pdb = desired_pdb(owner, spec, pdb_api_version)
    return out + ([pdb] if pdb is not None else [])
