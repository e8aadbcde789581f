"""Pod discovery through the apiserver for a Prometheus built without ``kubernetes_sd_configs``.

Debian's Prometheus 2.42 (the one registry-free Prometheus here) leaves the Kubernetes discoverer out
of its build. This serves the apiserver's pod list over Prometheus' ``http_sd_configs`` protocol with
the target labels ``kubernetes_sd_configs`` (role: pod) gives, one target per container port:
``__address__`` = podIP:port and the ``__meta_kubernetes_pod_*`` / ``__meta_kubernetes_namespace``
labels, so the chart's PodMonitor/ServiceMonitor relabelings apply unchanged. Running pods only.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _name(s: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", s)


def pod_targets(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for pod in pods:
        meta, spec, st = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        if st.get("phase") != "Running" or not st.get("podIP"):
            continue
        labels = {
            "__meta_kubernetes_namespace": meta["namespace"],
            "__meta_kubernetes_pod_name": meta["name"],
            "__meta_kubernetes_pod_ip": st["podIP"],
            "__meta_kubernetes_pod_node_name": spec.get("nodeName", ""),
            "__meta_kubernetes_pod_phase": st["phase"],
            "__meta_kubernetes_pod_ready": str(any(
                c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or [])).lower(),
        }
        for k, v in (meta.get("labels") or {}).items():
            labels[f"__meta_kubernetes_pod_label_{_name(k)}"] = v
            labels[f"__meta_kubernetes_pod_labelpresent_{_name(k)}"] = "true"
        for k, v in (meta.get("annotations") or {}).items():
            labels[f"__meta_kubernetes_pod_annotation_{_name(k)}"] = v
        for ctr in spec.get("containers") or []:
            for port in ctr.get("ports") or []:
                out.append({"targets": [f"{st['podIP']}:{port['containerPort']}"], "labels": {
                    **labels,
                    "__meta_kubernetes_pod_container_name": ctr["name"],
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                    "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
                }})
    return out


class PodDiscovery:
    """``http://127.0.0.1:<port>/pods``: the pods of every namespace, as Prometheus http_sd targets."""

    def __init__(self, cluster) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                code, body = cluster.request("GET", "/api/v1/pods")
                data = json.dumps(pod_targets(body["items"]) if code == 200 else []).encode()
                outer.requests += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a: Any) -> None:
                pass

        self.requests = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/pods"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
