"""Thin JSON-in/JSON-out access to the Kubernetes API (plain dicts, no generated models).

The generated client's typed methods validate bodies against its own models; the reconcile works
on plain dicts (the same shape as ``kubectl get -o json``), so requests go through the client's
transport (auth, TLS, proxies from the kubeconfig / in-cluster config) with JSON bodies.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import time
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from nightjar_operator import constants as c
from nightjar_operator.reconcile.children import selector_string, service_selector

log = logging.getLogger("nightjar.operator")

# kind -> (API prefix, plural)
KINDS: dict[str, tuple[str, str]] = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Service": ("/api/v1", "services"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),  # policy/v1beta1 before 1.21
    "HorizontalPodAutoscaler": ("/apis/autoscaling/v2", "horizontalpodautoscalers"),  # v2beta2 before 1.23
    "ScaledObject": ("/apis/keda.sh/v1alpha1", "scaledobjects"),
    "InferencePool": ("/apis/inference.networking.k8s.io/v1", "inferencepools"),
    "HTTPRoute": ("/apis/gateway.networking.k8s.io/v1", "httproutes"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    c.KIND: (f"/apis/{c.GROUP}/{c.VERSION}", c.PLURAL),
}


def make_api_client(kubeconfig: str | None = None) -> kubernetes.client.ApiClient:
    """In-cluster config inside a pod, else the kubeconfig (``$KUBECONFIG`` or ~/.kube/config)."""
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_incluster_config(client_configuration=cfg)
        return kubernetes.client.ApiClient(cfg)
    path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    return kubernetes.config.new_client_from_config(config_file=path)


class Api:
    def __init__(self, client: kubernetes.client.ApiClient, timeout_s: float = 30.0) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self._served: dict[str, bool] = {}
        self._asked: dict[str, float] = {}

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        m, url, hdrs, data, post = self.client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.client.call_api(m, url, hdrs, data, post, _request_timeout=self.timeout_s)
        raw = resp.read()
        if not 200 <= resp.status < 300:
            raise ApiException(status=resp.status, reason=resp.reason, body=raw.decode("utf-8", "replace"))
        return json.loads(raw) if raw else {}

    def served(self, group_version: str) -> bool:
        """Whether the cluster serves ``group/version``. A yes is kept; a no is asked again after a
        minute (KEDA, say, may be installed while the operator runs)."""
        now = time.monotonic()
        if self._served.get(group_version) is True or now < self._asked.get(group_version, -1e9) + 60:
            return self._served.get(group_version, False)
        prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
        try:
            self.request("GET", prefix)
            ok = True
        except ApiException as e:
            if e.status != 404:
                raise
            ok = False
        self._served[group_version], self._asked[group_version] = ok, now
        return ok

    def pdb_api_version(self) -> str:
        """policy/v1 where the cluster serves it (1.21+), else policy/v1beta1."""
        return "policy/v1" if self.served("policy/v1") else "policy/v1beta1"

    def hpa_api_version(self) -> str:
        """autoscaling/v2 where the cluster serves it (1.23+), else autoscaling/v2beta2."""
        return "autoscaling/v2" if self.served("autoscaling/v2") else "autoscaling/v2beta2"

    def path(self, kind: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
        prefix, plural = KINDS[kind]
        if kind == "PodDisruptionBudget":
            prefix = f"/apis/{self.pdb_api_version()}"
        elif kind == "HorizontalPodAutoscaler":
            prefix = f"/apis/{self.hpa_api_version()}"
        p = f"{prefix}/namespaces/{namespace}/{plural}"
        if name:
            p += f"/{name}"
        if sub:
            p += f"/{sub}"
        return p

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", self.path(kind, namespace, name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def worker_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """Every worker pod of NightjarDeployment ``name`` (stable and candidate tracks)."""
        query = {"labelSelector": selector_string(service_selector(name))}
        return self.request("GET", f"/api/v1/namespaces/{namespace}/pods", query=query).get("items", [])

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        # Our fieldManager in managedFields: with our labels, how an orphaned child is recognised
        # as the operator's (reconcile/diff.made_by_operator).
        return self.request("POST", self.path(obj["kind"], meta["namespace"]), obj, query={"fieldManager": c.FIELD_MANAGER})

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return self.request("PUT", self.path(obj["kind"], meta["namespace"], meta["name"]), obj,
                            query={"fieldManager": c.FIELD_MANAGER})

    def post_event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about ``body`` (what ``kubectl describe`` shows). Events are auxiliary: a
        failure is logged, never raised. Posted through this client, not kopf's poster, because kopf's
        only works inside its per-object handlers and the fleet loop posts from its own threads."""
        meta = body.get("metadata") or {}
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'object')}.", "namespace": meta.get("namespace")},
            "involvedObject": {
                "apiVersion": body.get("apiVersion") or f"{c.GROUP}/{c.VERSION}",
                "kind": body.get("kind") or c.KIND,
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1000],
            "source": {"component": c.OPERATOR_NAME},
            "reportingComponent": c.OPERATOR_NAME,
            "reportingInstance": os.environ.get("POD_NAME") or c.OPERATOR_NAME,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.request("POST", f"/api/v1/namespaces/{meta.get('namespace')}/events", event)
        except Exception as e:  # noqa: BLE001
            log.warning("event %s not posted for %s/%s: %s", reason, meta.get("namespace"), meta.get("name"), e)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any], resource_version: str | None) -> dict[str, Any]:
        """Merge-patch the CR's status subresource; with ``resource_version`` it fails (409) on a race."""
        body: dict[str, Any] = {"status": status}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return self.request(
            "PATCH", self.path(c.KIND, namespace, name, "status"), body, content_type="application/merge-patch+json"
        )


def namespace_terminating(e: ApiException) -> bool:
    """The apiserver refused a create because the namespace is being deleted (403, cause
    NamespaceTerminating): the namespace takes its objects with it, so there is nothing to repair."""
    if e.status != 403:
        return False
    try:
        causes = (json.loads(e.body or "{}").get("details") or {}).get("causes") or []
    except ValueError:
        return False
    return any(cause.get("reason") == "NamespaceTerminating" for cause in causes)


def api_error_reason(e: ApiException) -> str:
    """A short reason for metrics/logs: the apiserver's Status.reason or the HTTP status."""
    try:
        return json.loads(e.body or "{}").get("reason") or str(e.status)
    except ValueError:
        return str(e.status)
