"""The http_sd stand-in for kubernetes_sd_configs (role: pod) gives the labels the chart's monitors use."""

from __future__ import annotations

from pod_sd import pod_targets


def _pod(phase="Running", ip="10.244.0.7"):
    return {
        "metadata": {"name": "w-1", "namespace": "e2e", "labels": {"nightjar.dev/deployment": "smollm2"},
                     "annotations": {"prometheus.io/port": "8000"}},
        "spec": {"nodeName": "n", "containers": [{"name": "worker", "ports": [
            {"name": "http", "containerPort": 8000, "protocol": "TCP"}]}]},
        "status": {"phase": phase, "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_one_target_per_container_port_with_kubernetes_sd_labels():
    (t,) = pod_targets([_pod(), _pod(phase="Pending", ip=None)])
    assert t["targets"] == ["10.244.0.7:8000"]
    lb = t["labels"]
    assert lb["__meta_kubernetes_namespace"] == "e2e" and lb["__meta_kubernetes_pod_name"] == "w-1"
    assert lb["__meta_kubernetes_pod_label_nightjar_dev_deployment"] == "smollm2"
    assert lb["__meta_kubernetes_pod_annotation_prometheus_io_port"] == "8000"
    assert lb["__meta_kubernetes_pod_container_port_name"] == "http" and lb["__meta_kubernetes_pod_ready"] == "true"
