"""Turn a CR's ``spec`` into a validated model, or into errors that name the offending field.

Two layers: ``parse_spec`` (the pydantic models: what the CRD schema already enforces on the
apiserver, re-checked because a CRD may be stale or edited) and ``semantic_errors`` (cross-field
rules the apiserver cannot express without CEL: draft equals target, maxGamma out of the range a
worker supports, arms outside 0..maxGamma, ...). Either kind of error makes the reconcile set
``Ready=False, reason=InvalidSpec`` and leave the running children alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nightjar_contract.runtime import WorkerRuntimeConfig
from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from nightjar_operator import constants as c
from nightjar_operator.crd.models import NightjarDeploymentSpec

# vLLM sizes the draft proposer for K at start-up; beyond this the verification batch cost grows
# with no realistic acceptance gain, and the worker refuses it.
MAX_SUPPORTED_GAMMA = 16
MAX_NAME_LENGTH = 56  # leaves room for "-config" and still fits a 63-character Service name
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Flags the operator sets itself; letting vllmArgs repeat them would make the pod ambiguous.
RESERVED_ARGS = ("--model", "--draft", "--port", "--host", "--config", "--speculative-config", "--revision",
                 "--draft-revision", "--shutdown-timeout")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# hf://Org/Model, what the worker hands vLLM as a Hub repo id.
HF_URI = re.compile(r"^hf://[A-Za-z0-9][\w.-]*/[\w.-]+/?$")
WORKER_OFFLOAD_DEFAULTS = {"kv_usage_high": 0.90, "kv_usage_low": 0.70}


# Volume types a CR may mount without a cluster admin's say: they expose what anyone who may create
# pods in the namespace can already reach. hostPath, csi, nfs, ... (node or storage access) must be
# granted by the chart value operator.podPolicy.extraVolumeTypes.
DEFAULT_VOLUME_TYPES = frozenset({"configMap", "secret", "emptyDir", "persistentVolumeClaim", "ephemeral",
                                  "downwardAPI", "projected"})
# Projected sources allowed by default: no serviceAccountToken (a token the pod's identity did not
# grant the worker; the operator sets automountServiceAccountToken false). An admin may add
# "serviceAccountToken" to extraVolumeTypes.
DEFAULT_PROJECTED_SOURCES = frozenset({"configMap", "secret", "downwardAPI"})
EXTRA_VOLUME_TYPES_VALUE = "operator.podPolicy.extraVolumeTypes"


@dataclass(frozen=True)
class PodPolicy:
    """What a CR may put into its worker pods beyond the defaults, set by a cluster admin (chart value
    operator.podPolicy.extraVolumeTypes, env NIGHTJAR_POD_EXTRA_VOLUME_TYPES of the operator)."""

    extra_volume_types: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: str | None) -> PodPolicy:
        return cls(frozenset(t for t in (text or "").replace(",", " ").split() if t))

    def volume_types(self) -> frozenset[str]:
        return DEFAULT_VOLUME_TYPES | self.extra_volume_types

    def projected_sources(self) -> frozenset[str]:
        return DEFAULT_PROJECTED_SOURCES | (self.extra_volume_types & {"serviceAccountToken"})


@dataclass(frozen=True)
class FieldError:
    field: str  # dotted path as in the CR, e.g. spec.speculation.arms[2]
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _loc_to_path(prefix: str, loc: tuple[Any, ...]) -> str:
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part:
            path += f".{part}"
    return path


def parse_spec(raw: Mapping[str, Any] | None) -> tuple[NightjarDeploymentSpec | None, list[FieldError]]:
    """Validate the wire spec; on failure every error carries its ``spec.``-rooted field path."""
    try:
        return NightjarDeploymentSpec.model_validate(dict(raw or {})), []
    except ValidationError as e:
        errors = []
        for err in e.errors():
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
            msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
            msg = msg.removeprefix("Value error, ")
            errors.append(FieldError(_loc_to_path("spec", loc), msg))
        return None, errors


def validate(raw: Mapping[str, Any] | None, name: str, policy: PodPolicy) -> tuple[NightjarDeploymentSpec | None,
                                                                                   list[FieldError]]:
    """Every check of a spec, in one place: the reconcile (status InvalidSpec) and the admission
    webhook (the apply is refused) both call this, so they can never disagree."""
    spec, errors = parse_spec(raw)
    if spec is None:
        return None, errors
    return spec, semantic_errors(spec, name, policy)


def semantic_errors(spec: NightjarDeploymentSpec, name: str = "", policy: PodPolicy | None = None) -> list[FieldError]:
    """Cross-field rules; an empty list means the spec can be deployed."""
    errs: list[FieldError] = []
    if name and (len(name) > MAX_NAME_LENGTH or not DNS1035_LABEL.match(name)):
        errs.append(
            FieldError(
                "metadata.name",
                f"{name!r} must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters (it names a Service)",
            )
        )

    t, d = spec.target, spec.draft
    if d.source.location() == t.source.location():
        errs.append(FieldError("spec.draft.source", "the draft model must differ from the target model (same files)"))
    elif d.name == t.name and d.revision == t.revision:
        errs.append(FieldError("spec.draft.name", f"the draft model must differ from the target model ({t.name!r})"))

    for role, m in (("target", t), ("draft", d)):
        uri = m.source.uri
        if uri is not None and not HF_URI.match(uri):
            scheme = uri.split("://", 1)[0]
            why = (f"scheme {scheme}:// is not supported" if scheme != "hf" else "expected hf://Org/Model")
            errs.append(FieldError(f"spec.{role}.source.uri", f"{why} (got {uri!r}); use hf://Org/Model for a "
                                   "Hugging Face Hub repo, or an image, pvc or imagePath source"))
    if spec.model_cache.claim_name and spec.model_cache.claim_name in {
            m.source.pvc.claim_name for m in (t, d) if m.source.pvc is not None}:
        errs.append(FieldError("spec.modelCache.claimName", "must not be a model's PVC (models are mounted read-only)"))

    sp = spec.speculation
    k = sp.max_gamma
    if sp.policy == "nosd":
        pass  # speculation off: K is irrelevant
    elif not 1 <= k <= MAX_SUPPORTED_GAMMA:
        errs.append(
            FieldError(
                "spec.speculation.maxGamma",
                f"must lie in 1..{MAX_SUPPORTED_GAMMA} for policy {sp.policy!r} (got {k}); "
                "use policy nosd to turn speculation off",
            )
        )
    seen: set[int] = set()
    for i, arm in enumerate(sp.arms or []):
        if arm > k:
            errs.append(FieldError(f"spec.speculation.arms[{i}]", f"unknown arm {arm}: arms must lie in 0..maxGamma={k}"))
        elif arm in seen:
            errs.append(FieldError(f"spec.speculation.arms[{i}]", f"duplicate arm {arm}"))
        seen.add(arm)
    if sp.static_gamma is not None:
        if sp.static_gamma > k:
            errs.append(FieldError("spec.speculation.staticGamma", f"must lie in 0..maxGamma={k} (got {sp.static_gamma})"))
        elif sp.arms is not None and sp.static_gamma not in sp.arms:
            errs.append(FieldError("spec.speculation.staticGamma", f"{sp.static_gamma} is not one of arms {sp.arms}"))
    if sp.ngram and sp.policy != "nightjar":
        errs.append(FieldError("spec.speculation.ngram", f"n-gram arms are played by policy nightjar only (got {sp.policy!r})"))
    if sp.suffix.enabled and sp.policy != "nightjar":
        errs.append(FieldError("spec.speculation.suffix.enabled",
                               f"suffix-tree arms are played by policy nightjar only (got {sp.policy!r})"))
    high = sp.offload.kv_usage_high if sp.offload.kv_usage_high is not None else WORKER_OFFLOAD_DEFAULTS["kv_usage_high"]
    low = sp.offload.kv_usage_low if sp.offload.kv_usage_low is not None else WORKER_OFFLOAD_DEFAULTS["kv_usage_low"]
    if low >= high:
        field = "kvUsageLow" if sp.offload.kv_usage_low is not None else "kvUsageHigh"
        errs.append(
            FieldError(f"spec.speculation.offload.{field}", f"kvUsageLow ({low}) must be below kvUsageHigh ({high})")
        )

    a = spec.autoscaling
    if a.engine != "None":
        if a.max_replicas < a.min_replicas:
            errs.append(FieldError("spec.autoscaling.maxReplicas", f"must be at least minReplicas ({a.max_replicas} < {a.min_replicas})"))
        if a.engine == "HPA" and a.min_replicas < 1:
            errs.append(FieldError("spec.autoscaling.minReplicas", "must be at least 1 with engine HPA (KEDA can scale to zero)"))
        if a.engine == "KEDA" and not a.prometheus_url:
            errs.append(FieldError("spec.autoscaling.prometheusUrl", "engine KEDA needs the Prometheus its trigger queries"))

    errs.extend(routing_errors(spec, name))

    steps = spec.rollout.steps
    for i in range(1, len(steps)):
        if steps[i] <= steps[i - 1]:
            errs.append(FieldError(f"spec.rollout.steps[{i}]", f"steps must be strictly ascending ({steps[i - 1]} then {steps[i]})"))

    for i, arg in enumerate(spec.vllm_args):
        flag = arg.split("=", 1)[0].replace("_", "-")
        if flag in RESERVED_ARGS:
            errs.append(FieldError(f"spec.vllmArgs[{i}]", f"{flag} is set by the operator and cannot be overridden"))

    errs.extend(pod_override_errors(spec, policy or PodPolicy()))
    if not errs:
        errs.extend(planner_config_errors(spec))
    return errs


def routing_errors(spec: NightjarDeploymentSpec, name: str = "") -> list[FieldError]:
    r, errs = spec.routing, []
    pool = r.inference_pool
    if pool is not None and pool.candidate_endpoint_picker is not None:
        field = "spec.routing.inferencePool.candidateEndpointPicker"
        if r.http_route is None:
            errs.append(FieldError(field, "needs spec.routing.httpRoute: the share between the two pools is an HTTPRoute weight"))
        elif pool.candidate_endpoint_picker.name == pool.endpoint_picker.name:
            errs.append(FieldError(f"{field}.name", "must differ from endpointPicker.name: an endpoint picker serves one pool"))
    limit = 63 - len(c.candidate_name(""))  # a Service name is a DNS label
    if r.http_route is not None and pool is None and len(name) > limit:
        errs.append(FieldError("metadata.name", f"at most {limit} characters with spec.routing.httpRoute and no "
                               f"inferencePool: it names the Service {c.candidate_name(name)!r}"))  # fmt: skip
    return errs


def reserved_env(name: str) -> bool:
    """The worker's own variables (children.OWN_ENV, OWN_ENV_PREFIXES): neither spec.pod.env nor
    spec.pod.envFrom may set them."""
    from nightjar_operator.reconcile import children as ch

    return name in ch.OWN_ENV or name.startswith(ch.OWN_ENV_PREFIXES)


def env_prefix_reaches(prefix: str) -> str | None:
    """A reserved name that ``prefix`` + some key could produce, or None. envFrom's keys are only
    known when the kubelet starts the pod (and may change later), so the prefix alone must make
    every reserved name unreachable: no own prefix may start with it or be started by it, and no own
    name may extend it (a key is never empty)."""
    from nightjar_operator.reconcile import children as ch

    for own in ch.OWN_ENV_PREFIXES:
        if prefix.startswith(own) or own.startswith(prefix):
            return f"{own}*"
    return next((own for own in sorted(ch.OWN_ENV) if own.startswith(prefix) and own != prefix), None)


def volume_errors(i: int, volume: Mapping[str, Any], policy: PodPolicy) -> list[FieldError]:
    """A volume's source must be on the allowlist (projected: no service-account tokens)."""
    field, errs = f"spec.pod.volumes[{i}]", []
    allowed = policy.volume_types()
    for kind in sorted(k for k in volume if k != "name"):
        if kind not in allowed:
            errs.append(FieldError(f"{field}.{kind}", f"volume type {kind} is not allowed (allowed: "
                                   f"{', '.join(sorted(allowed))}); a cluster admin can allow more with the "
                                   f"chart value {EXTRA_VOLUME_TYPES_VALUE}"))
    sources = (volume.get("projected") or {}).get("sources") if "projected" in allowed else None
    for j, src in enumerate(sources or []):
        for kind in sorted(src or {}):
            if kind not in policy.projected_sources():
                errs.append(FieldError(f"{field}.projected.sources[{j}].{kind}", f"projected source {kind} is not "
                                       f"allowed (allowed: {', '.join(sorted(policy.projected_sources()))}); a cluster "
                                       f"admin can allow serviceAccountToken with {EXTRA_VOLUME_TYPES_VALUE}"))
    return errs


def pod_override_errors(spec: NightjarDeploymentSpec, policy: PodPolicy | None = None) -> list[FieldError]:
    """spec.pod may add to the worker pod but not shadow what the operator puts there, and may not
    reach beyond what the namespace already grants (volume allowlist)."""
    from nightjar_operator.reconcile import children as ch

    policy = policy or PodPolicy()

    o, errs = spec.pod, []
    own_labels = set(ch.common_labels("x")) | set(ch.pod_selector("x"))
    for key in o.labels or {}:
        if key in own_labels:
            errs.append(FieldError(f"spec.pod.labels[{key}]", "is set by the operator (it selects the pods)"))
        elif len(key) > 317 or not LABEL_KEY.match(key):
            errs.append(FieldError(f"spec.pod.labels[{key}]", "is not a valid label key ([prefix/]name)"))
    for i, e in enumerate(o.env or []):
        if reserved_env(e.name):
            errs.append(FieldError(f"spec.pod.env[{i}].name", f"{e.name} is set by the operator or reserved "
                                   f"(names starting {', '.join(ch.OWN_ENV_PREFIXES)}); use spec.hub for HF_*"))
        if (e.value is None) == (e.value_from is None):
            errs.append(FieldError(f"spec.pod.env[{i}]", "set exactly one of value and valueFrom"))
    for i, ef in enumerate(o.env_from or []):
        if (hit := env_prefix_reaches(ef.prefix or "")) is not None:
            errs.append(FieldError(f"spec.pod.envFrom[{i}].prefix",
                                   f"{f'prefix {ef.prefix!r}' if ef.prefix else 'no prefix'}: a key could set {hit}, which is set by the operator or "
                                   f"reserved: give a prefix no reserved name starts with (e.g. APP_), or use "
                                   f"spec.pod.env with valueFrom per variable"))
    volumes: set[str] = set()
    for i, v in enumerate(o.volumes or []):
        errs.extend(volume_errors(i, v, policy))
        n = str(v.get("name", ""))
        if not n:
            errs.append(FieldError(f"spec.pod.volumes[{i}].name", "required"))
        elif n in ch.OWN_VOLUMES or n.startswith("model-"):
            errs.append(FieldError(f"spec.pod.volumes[{i}].name", f"{n} is a volume of the operator's"))
        elif n in volumes:
            errs.append(FieldError(f"spec.pod.volumes[{i}].name", f"duplicate volume {n}"))
        volumes.add(n)
    for i, m in enumerate(o.volume_mounts or []):
        if m.name not in volumes:
            errs.append(FieldError(f"spec.pod.volumeMounts[{i}].name", f"no volume {m.name} in spec.pod.volumes"))
        path = m.mount_path.rstrip("/") or "/"
        for own in ch.OWN_MOUNT_DIRS:
            if path == own or path.startswith(own + "/") or own.startswith(path.rstrip("/") + "/") or path == "/":
                errs.append(FieldError(f"spec.pod.volumeMounts[{i}].mountPath",
                                       f"{m.mount_path} overlaps {own}, which the operator mounts"))
                break
    for i, t in enumerate(o.tolerations or []):
        if t.operator == "Exists" and t.value:
            errs.append(FieldError(f"spec.pod.tolerations[{i}].value", "must be empty when operator is Exists"))
    return errs


# Planner-config field -> CR field, to name the CR field when the worker's model rejects a value.
_PLANNER_FIELDS = {
    "policy": "spec.speculation.policy",
    "max_gamma": "spec.speculation.maxGamma",
    "arms": "spec.speculation.arms",
    "static_gamma": "spec.speculation.staticGamma",
    "ngram_arms": "spec.speculation.ngram",
    "suffix_arms": "spec.speculation.suffix.enabled",
    "switch_cost_s": "spec.speculation.switchingCostMs",
    "slo_tpot_s": "spec.slo.tpotP95Ms",
}


def planner_config_errors(spec: NightjarDeploymentSpec) -> list[FieldError]:
    """Run the worker's own config model over what the ConfigMap will carry."""
    from nightjar_operator.reconcile.config import runtime_config_dict

    try:
        WorkerRuntimeConfig.model_validate(runtime_config_dict(spec))
    except ValidationError as e:
        out = []
        for err in e.errors():
            loc = [str(p) for p in err["loc"]]
            field = next((_PLANNER_FIELDS[p] for p in loc if p in _PLANNER_FIELDS), "spec.speculation")
            if loc and loc[0] == "slo":
                field = "spec.slo"
            elif loc and loc[0] == "suffix":
                field = "spec.speculation.suffix" + (f".{to_camel(loc[1])}" if len(loc) > 1 else "")
            out.append(FieldError(field, err["msg"].removeprefix("Value error, ")))
        return out
    return []
