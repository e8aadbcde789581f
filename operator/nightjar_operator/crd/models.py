"""NightjarDeployment spec and status: the pydantic models are the source of truth.

The CRD's ``openAPIV3Schema`` is generated from these models (``crd/schema.py``), so everything the
apiserver can check structurally (types, enums, ranges, patterns, required fields, one-of) lives
here as field constraints. Cross-field rules the apiserver cannot express on Kubernetes 1.20 (no
CEL) live in ``reconcile/validate.py`` and surface as ``Ready=False, reason=InvalidSpec``.

Field names are camelCase on the wire (Kubernetes convention) and snake_case in Python.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from nightjar_contract.planner import DEFAULT_MAX_GAMMA, MAX_GAMMA
from nightjar_contract.runtime import TPOT_P95_MS_MAX, TTFT_P95_MS_MAX
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

# Kubernetes resource.Quantity (the regexp apimachinery publishes for it).
QUANTITY_PATTERN = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
URI_PATTERN = r"^[a-z][a-z0-9+.-]*://\S+$"
ABS_PATH_PATTERN = r"^/\S*$"
REL_PATH_PATTERN = r"^[^/\s]\S*$|^$"
CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"

MAX_SCHEMA_GAMMA = MAX_GAMMA  # structural bound; what a worker supports is checked semantically


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", use_attribute_docstrings=True
    )

    def wire(self) -> dict[str, Any]:
        """The object as it appears in the Kubernetes API (camelCase, no unset optionals)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _quantity(v: int | float | str | None, field: str) -> int | float | str | None:
    if isinstance(v, str) and not re.match(QUANTITY_PATTERN, v):
        raise ValueError(f"{field}: {v!r} is not a Kubernetes quantity (e.g. 500m, 2, 16Gi)")
    return v


def quantity_field(**kw: Any) -> Any:
    """A Kubernetes quantity: ``x-kubernetes-int-or-string`` with the quantity pattern in the schema."""
    return Field(None, json_schema_extra={"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}, **kw)


# ---------------------------------------------------------------------------------------------- spec
class PvcSource(_Model):
    """Model files on a PersistentVolumeClaim (mounted read-only into the worker)."""

    claim_name: str = Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)
    """Name of the PVC in the NightjarDeployment's namespace."""
    path: str = Field("", max_length=1024, pattern=REL_PATH_PATTERN)
    """Directory inside the volume (relative; empty for the volume root)."""


# An image reference: [registry[:port]/]repository[:tag][@digest] (no spaces, lower-case repository).
IMAGE_REF_PATTERN = r"^[a-z0-9]+([._:/-][a-zA-Z0-9_.-]+)*(@sha256:[a-f0-9]{64})?$"
MODELCAR_ROOT = "/models"


class ImageSource(_Model):
    """Model files in an OCI image laid out as a "modelcar": directories under /models, and a shell
    with cp (busybox). An init container copies the directory into a volume the worker reads."""

    reference: str = Field(min_length=1, max_length=1024, pattern=IMAGE_REF_PATTERN)
    """Image reference, e.g. ghcr.io/nightjar-dev/nightjar-models:smollm2-135m."""
    path: str = Field("", max_length=1024, pattern=REL_PATH_PATTERN)
    """Model directory under /models in the image (relative; empty for /models itself). It must hold
    the model's config.json."""
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """imagePullPolicy of the init container that copies the model."""

    def directory(self) -> str:
        sub = self.path.strip("/")
        return f"{MODELCAR_ROOT}/{sub}" if sub else MODELCAR_ROOT


class ModelSource(_Model):
    """Where the model comes from: exactly one of pvc, uri, image or imagePath."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"required": ["pvc"]}, {"required": ["uri"]}, {"required": ["image"]}, {"required": ["imagePath"]}]})

    pvc: PvcSource | None = None
    """A directory on a PersistentVolumeClaim."""
    uri: str | None = Field(None, max_length=2048, pattern=URI_PATTERN)
    """hf://Org/Model: a Hugging Face Hub repo, downloaded by the worker's vLLM into spec.modelCache
    (revision pins it; spec.hub gives the token). No other scheme is supported."""
    image: ImageSource | None = None
    """A model image (modelcar layout), copied into the pod by an init container."""
    image_path: str | None = Field(None, max_length=1024, pattern=ABS_PATH_PATTERN)
    """An absolute path baked into the worker image."""

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        given = [k for k in ("pvc", "uri", "image", "imagePath") if getattr(self, to_snake(k)) is not None]
        if len(given) != 1:
            raise ValueError(f"exactly one of pvc, uri, image, imagePath must be set (got {given or 'none'})")
        return self

    def location(self) -> tuple[str, str]:
        """A comparable identity of the files (kind, where)."""
        if self.pvc is not None:
            return ("pvc", f"{self.pvc.claim_name}/{self.pvc.path.strip('/')}")
        if self.uri is not None:
            return ("uri", self.uri.rstrip("/"))
        if self.image is not None:
            return ("oci", f"{self.image.reference}/{self.image.path.strip('/')}")
        return ("image", (self.image_path or "").rstrip("/"))


def to_snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


class ModelRef(_Model):
    """One model of the pair."""

    name: str = Field(min_length=1, max_length=253)
    """Display name (shown by kubectl get njd and in metrics), e.g. Qwen2.5-7B-Instruct."""
    source: ModelSource
    revision: str | None = Field(None, max_length=256, pattern=r"^\S+$")
    """Revision (git commit, tag or branch) for URI sources; recorded on the pods for the others."""


class OffloadSpec(_Model):
    """Elastic draft memory: offload the draft's weights under load and give the bytes to the KV cache."""

    policy: Literal["Auto", "Never"] = "Auto"
    """Auto: the worker offloads and reloads the draft by itself; Never: the draft stays resident."""
    kv_usage_high: float | None = Field(None, ge=0, le=1)
    """KV-cache usage share counted as memory pressure (worker default 0.90)."""
    kv_usage_low: float | None = Field(None, ge=0, le=1)
    """Reload the draft only when used blocks fit in this share of the base pool (worker default 0.70)."""
    recheck_after_seconds: float | None = Field(None, ge=0)
    """Bring an offloaded draft back after this long with the KV cache calm although the planner does
    not ask for it (its estimates predate the load); 0: only when the planner asks (worker default 30)."""
    allow_unverified_cuda: bool = False
    """GPU workers: offload although this build's KV page release in CUDA virtual memory has not passed
    a GPU check (make gpu-check); without it they keep the draft resident and say why. For testing."""


class SecretKeyRef(_Model):
    """A key of a Secret in the NightjarDeployment's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)
    key: str = Field("HF_TOKEN", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")


class HubSpec(_Model):
    """Access to the Hugging Face Hub for ``hf://`` sources (the worker's vLLM downloads them)."""

    token_secret_ref: SecretKeyRef | None = None
    """Secret key holding an access token (gated or private models), given to the worker as HF_TOKEN."""
    endpoint: str | None = Field(None, max_length=2048, pattern=r"^https?://\S+$")
    """A Hub mirror or proxy (HF_ENDPOINT), e.g. for clusters without internet access."""


class ApiKeySecretRef(SecretKeyRef):
    """A key of a Secret in the NightjarDeployment's namespace holding the API key."""

    key: str = Field("api-key", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")


class AuthSpec(_Model):
    """Who may call the workers' OpenAI API (vLLM's own API key check, env VLLM_API_KEY)."""

    api_key_secret_ref: ApiKeySecretRef | None = None
    """Secret key holding the API key: requests under /v1 need ``Authorization: Bearer <key>`` (401
    otherwise); /health and /metrics stay open for the kubelet, Prometheus and the operator."""


class ModelCacheSpec(_Model):
    """Where downloaded models and vLLM's compile cache live, so a container restart does not
    download again: an emptyDir (lives as long as the pod) or a PersistentVolumeClaim (outlives it)."""

    size_limit: int | str | None = quantity_field()
    """sizeLimit of the emptyDir (e.g. 40Gi); the kubelet evicts a pod that writes more."""
    claim_name: str | None = Field(None, min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)
    """A PVC in the namespace mounted read-write instead (ReadWriteMany when replicas > 1)."""

    @field_validator("size_limit")
    @classmethod
    def _q(cls, v: Any) -> Any:
        return _quantity(v, "sizeLimit")

    @model_validator(mode="after")
    def _one(self) -> ModelCacheSpec:
        if self.size_limit is not None and self.claim_name is not None:
            raise ValueError("set sizeLimit (emptyDir) or claimName (PVC), not both")
        return self


class SuffixSpec(_Model):
    """Suffix-tree drafts (SuffixDecoding, Arctic Inference's cache): matched in suffix trees over the
    request's own tokens and over the outputs of earlier requests, so a workload that repeats itself
    (the same task asked again, agent loops, code edits) is drafted from what it answered before. No
    draft model and no KV memory: speculation goes on while the draft is offloaded. The tree settings
    are read when a worker starts (a change rolls the pods)."""

    enabled: bool = False
    """Offer suffix-tree arms at the same gammas as the draft model's (policy nightjar)."""
    cache_requests: int | None = Field(None, ge=0, le=2**31 - 1)
    """Outputs of finished requests kept in the cross-request tree, evicted oldest first; 0: each
    request drafts from its own tokens only (worker default 1000; about 300 bytes per cached output
    token at worst, reported by nightjar_suffix_cache_bytes)."""
    tree_depth: int | None = Field(None, ge=1, le=256)
    """Longest context matched and longest draft, in tokens (worker default 24)."""
    spec_factor: float | None = Field(None, ge=0)
    """A draft is at most specFactor x the matched length (worker default 1.0)."""
    min_token_prob: float | None = Field(None, ge=0, le=1)
    """Drafts stop at a token the tree estimates less likely than this (worker default 0.1)."""


class SpeculationSpec(_Model):
    """How the planner speculates."""

    policy: Literal["nightjar", "nosd", "static", "ucb"] = "nightjar"
    """Gamma policy: nightjar (the contextual bandit) or a baseline (nosd: never speculate; static: always
    staticGamma; ucb: a context-free bandit)."""
    max_gamma: int = Field(DEFAULT_MAX_GAMMA, ge=0, le=MAX_SCHEMA_GAMMA)
    """K, the largest speculation length; the planner's arms are gamma in 0..K."""
    arms: list[Annotated[int, Field(ge=0, le=MAX_SCHEMA_GAMMA)]] | None = Field(
        None, min_length=1, max_length=MAX_SCHEMA_GAMMA + 1
    )
    """Subset of 0..maxGamma the planner may choose (default: all)."""
    static_gamma: int | None = Field(None, ge=0, le=MAX_SCHEMA_GAMMA)
    """Gamma for policy static (default maxGamma)."""
    ngram: bool = False
    """Also offer n-gram (prompt lookup) arms at the same gammas: drafts matched in the request's own
    tokens, no draft model and no KV memory, so speculation goes on while the draft is offloaded
    (policy nightjar)."""
    suffix: SuffixSpec = Field(default_factory=SuffixSpec, json_schema_extra={"default": {}})
    """Suffix-tree drafts: matched over the request's own tokens and earlier requests' outputs, no draft
    model and no KV memory (speculation goes on while the draft is offloaded). enabled offers their arms
    (policy nightjar); the tree settings are read when a worker starts (a change rolls the pods)."""
    switching_cost_ms: float | None = Field(None, ge=0)
    """Override the measured switching cost C_switch (milliseconds)."""
    offload: OffloadSpec = Field(default_factory=OffloadSpec, json_schema_extra={"default": {}})


# --------------------------------------------------------------------- worker pod overrides
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
_K8S_OBJECT = {"x-kubernetes-preserve-unknown-fields": True}  # a core/v1 type the apiserver checks in the pod


def k8s_object(description: str = "") -> Any:
    return Field(None, json_schema_extra=_K8S_OBJECT, description=description or None)


class LocalObjectReference(_Model):
    name: str = Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)


class Toleration(_Model):
    """core/v1 Toleration."""

    key: str | None = Field(None, max_length=317)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class EnvVar(_Model):
    """core/v1 EnvVar: a value, or valueFrom (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef)."""

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME)
    value: str | None = None
    value_from: dict[str, Any] | None = k8s_object()


class EnvFromSource(_Model):
    """core/v1 EnvFromSource: every key of a ConfigMap or Secret as environment variables."""

    prefix: str | None = Field(None, max_length=256)
    config_map_ref: dict[str, Any] | None = k8s_object()
    secret_ref: dict[str, Any] | None = k8s_object()


class VolumeMount(_Model):
    """core/v1 VolumeMount into the worker container (of a volume in pod.volumes)."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS1123_LABEL)
    mount_path: str = Field(min_length=1, max_length=1024, pattern=ABS_PATH_PATTERN)
    read_only: bool | None = None
    sub_path: str | None = Field(None, max_length=1024, pattern=REL_PATH_PATTERN)


class PodSpecOverrides(_Model):
    """What real clusters add to the worker pods: scheduling, identity, extra env and volumes.
    core/v1 objects kept whole (affinity, volumes, ...) are checked by the apiserver when the
    operator applies the Deployment; a refusal is reported in Degraded, naming the field."""

    node_selector: dict[str, Annotated[str, Field(max_length=63)]] | None = None
    tolerations: list[Toleration] | None = Field(None, max_length=64)
    affinity: dict[str, Any] | None = k8s_object("core/v1 Affinity")
    topology_spread_constraints: list[dict[str, Any]] | None = Field(
        None, max_length=16, json_schema_extra={"items": {"type": "object", **_K8S_OBJECT}})
    """core/v1 TopologySpreadConstraint list; labelSelector defaults to this pool's pods when omitted."""
    runtime_class_name: str | None = Field(None, max_length=253, pattern=DNS1123_SUBDOMAIN)
    priority_class_name: str | None = Field(None, max_length=253, pattern=DNS1123_SUBDOMAIN)
    service_account_name: str | None = Field(None, max_length=253, pattern=DNS1123_SUBDOMAIN)
    """A ServiceAccount for the workers (e.g. for image pulls or a mesh identity); its token is still
    not mounted (workers never call the Kubernetes API)."""
    image_pull_secrets: list[LocalObjectReference] | None = Field(None, max_length=16)
    labels: dict[str, Annotated[str, Field(max_length=63)]] | None = None
    """Extra pod labels (keys: qualified names); the operator's own label keys are refused."""
    annotations: dict[str, Annotated[str, Field(max_length=4096)]] | None = None
    """Extra pod annotations (e.g. for a service mesh); operator-set keys win."""
    env: list[EnvVar] | None = Field(None, max_length=128)
    """Extra worker environment; names the operator sets (NIGHTJAR_*, HF_*, ...) are refused."""
    env_from: list[EnvFromSource] | None = Field(None, max_length=16)
    volumes: list[dict[str, Any]] | None = Field(
        None, max_length=32, json_schema_extra={"items": {"type": "object", "required": ["name"], **_K8S_OBJECT}})
    """core/v1 Volume list; names the operator uses (config, tmp, cache, shm, oci-models, model-N) are refused."""
    volume_mounts: list[VolumeMount] | None = Field(None, max_length=32)


class NetworkPolicyPeer(_Model):
    """networking.k8s.io/v1 NetworkPolicyPeer: pods and/or namespaces by label, or an IP block."""

    namespace_selector: dict[str, Any] | None = k8s_object("metav1 LabelSelector of namespaces")
    pod_selector: dict[str, Any] | None = k8s_object("metav1 LabelSelector of pods")
    ip_block: dict[str, Any] | None = k8s_object("networking/v1 IPBlock (cidr, except)")


class NetworkPolicySpec(_Model):
    """A NetworkPolicy owned by the operator that admits to the workers' port only the peers listed
    here, the operator (its fleet loop scrapes /metrics) and the peers the chart adds for every
    NightjarDeployment (Prometheus: chart value networkPolicy.extraFrom). Layer 4 only: whoever is
    admitted reaches /v1 and /metrics alike (the API key guards /v1). Needs a CNI that enforces
    NetworkPolicy (docs/security.md)."""

    enabled: bool = False
    from_: list[NetworkPolicyPeer] = Field(default_factory=list, alias="from", max_length=32)
    """Who may call the workers (a Gateway's pods, client namespaces), besides the operator."""


class DrainSpec(_Model):
    """How a worker pod stops: out of the Service first, then in-flight requests finish."""

    pre_stop_delay_seconds: int = Field(5, ge=0, le=300)
    """preStop sleep before SIGTERM, while endpoint removal reaches every proxy and router."""
    drain_seconds: int = Field(30, ge=0, le=3600)
    """After SIGTERM the worker admits nothing new and lets running requests finish for up to this
    long (vLLM --shutdown-timeout; 0 aborts them). The pod's terminationGracePeriodSeconds is
    preStopDelaySeconds + drainSeconds + 15."""


class DisruptionBudgetSpec(_Model):
    """A PodDisruptionBudget over the worker pods (voluntary evictions: node drains, upgrades)."""

    enabled: bool | None = None
    """Default: on when replicas > 1 (with one replica a budget would block every node drain)."""
    max_unavailable: int | str = Field(1, json_schema_extra={"x-kubernetes-int-or-string": True,
                                                              "pattern": r"^([0-9]+|[0-9]+%)$"})
    """Pods that may be evicted at once: a count or a percentage (e.g. 25%)."""

    @field_validator("max_unavailable")
    @classmethod
    def _mu(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 0 or isinstance(v, str) and not re.match(r"^([0-9]+|[0-9]+%)$", v):
            raise ValueError(f"maxUnavailable: expected a count >= 0 or a percentage (got {v!r})")
        return v


class AutoscalingSpec(_Model):
    """An autoscaler on the workers' queue depth (vllm:num_requests_waiting), created and owned by the
    operator, that scales the NightjarDeployment through its scale subresource: spec.replicas then
    belongs to the autoscaler (leave it out of what you apply)."""

    engine: Literal["None", "HPA", "KEDA"] = "None"
    """HPA: a HorizontalPodAutoscaler (autoscaling/v2, or v2beta2 before Kubernetes 1.23) on a Pods
    metric that a metrics adapter (prometheus-adapter) serves; KEDA: a KEDA ScaledObject with a
    Prometheus trigger (KEDA installed in the cluster)."""
    min_replicas: int = Field(1, ge=0, le=1000)
    """Fewest workers (0 only with KEDA: scale to zero when no request waits)."""
    max_replicas: int = Field(4, ge=1, le=1000)
    waiting_per_replica: float = Field(4.0, gt=0, le=10_000)
    """Target mean of vllm:num_requests_waiting per worker: above it the autoscaler adds workers."""
    hpa_metric: str = Field("vllm_num_requests_waiting", min_length=1, max_length=253, pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
    """HPA: the Pods metric's name as the metrics adapter serves it (docs/autoscaling.md has a rule)."""
    prometheus_url: str | None = Field(None, max_length=2048, pattern=r"^https?://\S+$")
    """KEDA: the Prometheus the trigger queries (e.g. http://prometheus-operated.monitoring:9090)."""
    query: str | None = Field(None, min_length=1, max_length=4096)
    """KEDA: the PromQL (default: the waiting requests of this NightjarDeployment's pods, by the
    namespace and nightjar_deployment labels that the chart's PodMonitor attaches)."""
    cooldown_seconds: int = Field(300, ge=0, le=86_400)
    """Seconds of quiet before scaling down (HPA: the scale-down stabilization window)."""


class ParentReference(_Model):
    """A Gateway (or one of its listeners) the HTTPRoute attaches to (Gateway API ParentReference)."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)
    namespace: str | None = Field(None, min_length=1, max_length=63, pattern=DNS1123_LABEL)
    """Default: the NightjarDeployment's namespace (the Gateway must allow routes from it)."""
    section_name: str | None = Field(None, min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)
    """A listener of the Gateway (default: every listener that accepts the route)."""


class HTTPRouteSpec(_Model):
    """An HTTPRoute from Gateways to the workers (gateway.networking.k8s.io/v1)."""

    parent_refs: list[ParentReference] = Field(min_length=1, max_length=32)
    hostnames: list[Annotated[str, Field(min_length=1, max_length=253, pattern=r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")]] | None = Field(None, max_length=16)
    """Host names the route matches (default: every host of the Gateway's listeners)."""
    path_prefix: str = Field("/", min_length=1, max_length=1024, pattern=ABS_PATH_PATTERN)
    """Requests under this path go to the workers (their OpenAI-compatible API: /v1/...)."""


class EndpointPickerRef(_Model):
    """The endpoint picker (EPP) Service that routes a pool's requests to its pods by their queues and
    KV cache. You deploy it (the Gateway API Inference Extension's or llm-d's inferencepool chart),
    configured for the pool the operator creates (docs/routing.md)."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS1123_LABEL)
    """Name of the endpoint picker's Service in the NightjarDeployment's namespace."""
    port: int = Field(9002, ge=1, le=65535)
    """Its gRPC (ext-proc) port."""
    failure_mode: Literal["FailOpen", "FailClose"] = "FailClose"
    """When the picker does not answer: FailOpen sends the request to some pod of the pool,
    FailClose refuses it."""


class InferencePoolSpec(_Model):
    """An InferencePool over the workers (inference.networking.k8s.io/v1, the Gateway API Inference
    Extension), so an endpoint-picking Gateway routes to them."""

    endpoint_picker: EndpointPickerRef
    """The pool's endpoint picker."""
    candidate_endpoint_picker: EndpointPickerRef | None = None
    """The picker of a second pool over a rollout's candidate pods (a picker serves one pool). With
    it and an httpRoute the canary's share is an HTTPRoute weight between the two pools; without
    it the one pool spans both revisions and the share is a share of the replicas."""


class RoutingSpec(_Model):
    """Gateway API objects in front of the workers, owned by the operator. The workers' own Service
    is there either way."""

    http_route: HTTPRouteSpec | None = None
    """An HTTPRoute to the workers (to the InferencePool when inferencePool is set, else to a
    Service per revision). During a model-pair rollout its backend weights carry the canary's share
    and the stable revision keeps all its replicas (docs/routing.md)."""
    inference_pool: InferencePoolSpec | None = None


class SloSpec(_Model):
    """Latency objectives; the planner respects tpotP95Ms, the fleet loop reports attainment (SLOMet)."""

    ttft_p95_ms: int | None = Field(None, ge=1, le=TTFT_P95_MS_MAX)
    """Time to first token, p95, milliseconds."""
    tpot_p95_ms: int | None = Field(None, ge=1, le=TPOT_P95_MS_MAX)
    """Time per output token, p95, milliseconds."""
    attainment: float = Field(0.99, ge=0, le=1)
    """Objective: fraction of requests that must meet the targets (0..1)."""


class ResourceList(_Model):
    cpu: int | str | None = quantity_field()
    memory: int | str | None = quantity_field()
    ephemeral_storage: int | str | None = quantity_field(alias="ephemeral-storage")

    @field_validator("cpu", "memory", "ephemeral_storage")
    @classmethod
    def _q(cls, v: Any, info) -> Any:
        return _quantity(v, info.field_name)

    def k8s(self) -> dict[str, str]:
        out = {}
        for key in ("cpu", "memory", "ephemeral-storage"):
            v = self.model_dump(by_alias=True).get(key)
            if v is not None:
                out[key] = str(v)
        return out


class ResourcesSpec(_Model):
    """Worker container resources."""

    gpus: int = Field(0, ge=0, le=16)
    """Accelerators per worker pod (request = limit, resource acceleratorResource); 0 runs on CPU."""
    accelerator_resource: str = Field("nvidia.com/gpu", max_length=253,
                                      pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")
    """Extended resource name of the accelerator (nvidia.com/gpu, amd.com/gpu, a MIG profile such as
    nvidia.com/mig-3g.40gb, ...)."""
    requests: ResourceList | None = None
    limits: ResourceList | None = None


class RolloutSpec(_Model):
    """How a change of the model pair is rolled out (used by the fleet/rollout loop)."""

    steps: list[Annotated[int, Field(ge=1, le=100)]] = Field(
        default_factory=lambda: [10, 50, 100], min_length=1, max_length=20, json_schema_extra={"default": [10, 50, 100]}
    )
    """Candidate traffic share per step, percent, ascending, each 1..100."""
    analysis_window_seconds: int = Field(300, ge=10, le=86_400)
    """How long each step is observed before promoting or rolling back."""
    strategy: Literal["Canary", "Replace"] = "Canary"
    """Canary: a new model pair runs as a candidate revision through the steps, gated by SLO analysis;
    Replace: the new pair replaces the old one directly (rolling update of the one Deployment)."""


class NightjarDeploymentSpec(_Model):
    """Desired state of a pool of Nightjar workers serving one target/draft model pair."""

    target: ModelRef
    """The model that is served (verifies the draft's proposals)."""
    draft: ModelRef
    """The small draft model that proposes tokens."""
    speculation: SpeculationSpec = Field(default_factory=SpeculationSpec, json_schema_extra={"default": {}})
    slo: SloSpec = Field(default_factory=SloSpec, json_schema_extra={"default": {}})
    replicas: int = Field(1, ge=0, le=1000)
    """Number of worker pods (scale subresource: kubectl scale njd, HPA)."""
    image: str = Field(min_length=1, max_length=1024, pattern=r"^\S+$")
    """Worker container image (required: the CPU and CUDA builds differ, e.g.
    ghcr.io/nightjar-dev/nightjar-worker:VERSION-cpu, or VERSION for CUDA; docs/install.md)."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, json_schema_extra={"default": {}})
    pod_annotations: dict[str, Annotated[str, Field(max_length=4096)]] | None = None
    """Deprecated: use pod.annotations (both are applied; pod.annotations wins)."""
    pod: PodSpecOverrides = Field(default_factory=PodSpecOverrides, json_schema_extra={"default": {}})
    """Worker pod overrides: scheduling, identity, extra env, volumes, labels, annotations."""
    drain: DrainSpec = Field(default_factory=DrainSpec, json_schema_extra={"default": {}})
    disruption_budget: DisruptionBudgetSpec = Field(default_factory=DisruptionBudgetSpec,
                                                    json_schema_extra={"default": {}})
    hub: HubSpec = Field(default_factory=HubSpec, json_schema_extra={"default": {}})
    auth: AuthSpec = Field(default_factory=AuthSpec, json_schema_extra={"default": {}})
    network_policy: NetworkPolicySpec = Field(default_factory=NetworkPolicySpec, json_schema_extra={"default": {}})
    model_cache: ModelCacheSpec = Field(default_factory=ModelCacheSpec, json_schema_extra={"default": {}})
    vllm_args: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        default_factory=list, max_length=100
    )
    """Extra arguments appended to the vLLM engine arguments (e.g. --max-model-len=4096)."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, json_schema_extra={"default": {}})
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec, json_schema_extra={"default": {}})
    routing: RoutingSpec = Field(default_factory=RoutingSpec, json_schema_extra={"default": {}})


# -------------------------------------------------------------------------------------------- status
class Condition(_Model):
    """A Kubernetes-style condition (metav1.Condition)."""

    model_config = ConfigDict(extra="ignore")

    type: str = Field(min_length=1, max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(min_length=1, max_length=1024, pattern=CONDITION_REASON)
    message: str = Field("", max_length=32768)
    observed_generation: int | None = Field(None, ge=0)
    last_transition_time: str = Field(json_schema_extra={"format": "date-time"})


class ModelPairStatus(_Model):
    """A model pair as it runs in the cluster (reserved for the fleet/rollout loop as well)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})

    target: str | None = None
    draft: str | None = None
    deployment: str | None = None
    replicas: int | None = None
    ready_replicas: int | None = None


class FleetStatus(_Model):
    """What the fleet loop measured (scrapes, SLO, priors); its shape belongs to the fleet loop."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})

    observed_at: str | None = Field(None, json_schema_extra={"format": "date-time"})


class RolloutStatus(_Model):
    """State of the model-pair rollout (revisions, step, window, last decision); owned by the rollout loop."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})

    phase: str | None = None


class NightjarDeploymentStatus(_Model):
    """Observed state, computed from what the cluster shows."""

    model_config = ConfigDict(extra="allow")

    observed_generation: int | None = None
    replicas: int | None = None
    ready_replicas: int | None = None
    updated_replicas: int | None = None
    selector: str | None = None
    """Label selector of all worker pods (scale subresource, HPA)."""
    target: str | None = None
    """Target model currently served by the stable Deployment."""
    draft: str | None = None
    """Draft model currently served by the stable Deployment."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    stable: ModelPairStatus | None = None
    candidate: ModelPairStatus | None = None
    fleet: FleetStatus | None = None
    rollout: RolloutStatus | None = None
