"""The autoscaler child of a NightjarDeployment (``spec.autoscaling``). Pure.

Both kinds scale the NightjarDeployment itself through its scale subresource, not the worker
Deployment: the operator turns ``spec.replicas`` into the worker Deployment's replicas (a rollout's
stable/candidate split included), so the autoscaler and the rollout never fight over a Deployment.
The signal is the queue, ``vllm:num_requests_waiting``, and not ``vllm:kv_cache_usage_perc``:
elastic memory grows and shrinks the KV pool (the draft's weights leave and return), so the usage
fraction moves without any change in load (docs/autoscaling.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nightjar_operator import constants as c
from nightjar_operator.crd.models import AutoscalingSpec, NightjarDeploymentSpec
from nightjar_operator.reconcile.children import Owner, _meta, _with_hash
from nightjar_operator.reconcile.status import Condition

HPA_VERSIONS = ("autoscaling/v2", "autoscaling/v2beta2")  # v2 from Kubernetes 1.23, v2beta2 before
KEDA_VERSION = "keda.sh/v1alpha1"
KINDS = ("HorizontalPodAutoscaler", "ScaledObject")

def quantity(v: float) -> str:
    """A Kubernetes quantity for a target value (4 -> "4", 0.5 -> "500m")."""
    return str(int(v)) if float(v).is_integer() else f"{round(v * 1000)}m"


def default_query(namespace: str, name: str) -> str:
    return f'sum(vllm:num_requests_waiting{{namespace="{namespace}",nightjar_deployment="{name}"}})'


def _target(owner: Owner) -> dict[str, str]:
    return {"apiVersion": c.API_VERSION, "kind": c.KIND, "name": owner.name}


def desired_hpa(owner: Owner, a: AutoscalingSpec, api_version: str) -> dict[str, Any]:
    obj = {
        "apiVersion": api_version,
        "kind": "HorizontalPodAutoscaler",
        "metadata": _meta(owner, owner.name),
        "spec": {
            "scaleTargetRef": _target(owner),
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": a.hpa_metric},
                "target": {"type": "AverageValue", "averageValue": quantity(a.waiting_per_replica)},
            }}],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": min(a.cooldown_seconds, 3600)}},
        },
    }  # fmt: skip
    return _with_hash(obj)


def desired_scaled_object(owner: Owner, a: AutoscalingSpec) -> dict[str, Any]:
    obj = {
        "apiVersion": KEDA_VERSION,
        "kind": "ScaledObject",
        "metadata": _meta(owner, owner.name),
        "spec": {
            "scaleTargetRef": _target(owner),
            "minReplicaCount": a.min_replicas,
            "maxReplicaCount": a.max_replicas,
            "cooldownPeriod": a.cooldown_seconds,
            # KEDA divides the query's value by the threshold: workers = ceil(waiting / per replica).
            "triggers": [{"type": "prometheus", "metadata": {
                "serverAddress": a.prometheus_url or "",
                "query": a.query or default_query(owner.namespace, owner.name),
                "threshold": str(a.waiting_per_replica),
            }}],
        },
    }  # fmt: skip
    return _with_hash(obj)


def desired_autoscaler(owner: Owner, spec: NightjarDeploymentSpec, served: Callable[[str], bool],
                       had_condition: bool = False) -> tuple[dict[str, Any] | None, Condition | None]:
    """The autoscaler to have (or None) and the Autoscaling condition (None: leave it out; it is
    only written once autoscaling was asked for)."""
    a = spec.autoscaling
    span = f"{a.min_replicas}..{a.max_replicas} replicas at {quantity(a.waiting_per_replica)} waiting requests per replica"
    if a.engine == "HPA":
        version = next((v for v in HPA_VERSIONS if served(v)), None)
        if version is None:
            return None, ("False", "HPANotServed", "spec.autoscaling.engine: this cluster serves neither "
                          f"{' nor '.join(HPA_VERSIONS)}; spec.replicas stays as set")  # fmt: skip
        return desired_hpa(owner, a, version), (
            "True", "HorizontalPodAutoscaler",
            f"{version} HorizontalPodAutoscaler {owner.name}: {span} (Pods metric {a.hpa_metric} from the metrics adapter)",
        )  # fmt: skip
    if a.engine == "KEDA":
        if not served(KEDA_VERSION):
            return None, ("False", "KEDANotInstalled", f"spec.autoscaling.engine: KEDA is not installed ({KEDA_VERSION} "
                          "is not served by this cluster); spec.replicas stays as set")  # fmt: skip
        return desired_scaled_object(owner, a), ("True", "ScaledObject", f"KEDA ScaledObject {owner.name}: {span}")
    return None, (("False", "Disabled", "spec.autoscaling.engine is None: spec.replicas is set by you")
                  if had_condition else None)  # fmt: skip
