"""Test support: a real Kubernetes control plane (``cluster.LocalCluster``) with one real node
(``kubelet_node``: kubelet, kube-proxy, containerd; containers run) or fake nodes (``fake_kubelet``:
pods reported Running/Ready with loopback IPs; containers never run).

Importing this package is cheap: nothing starts and the kubernetes client is not imported. Names are
resolved lazily so ``python -m nightjar_operator.testing.cluster`` does not import the module twice.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "POD_IP_ANNOTATION",
    "POD_READINESS_ANNOTATION",
    "BinariesMissing",
    "ClusterError",
    "KubectlError",
    "LocalCluster",
    "missing_binaries",
    "stale_build",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from nightjar_operator.testing import cluster

        return getattr(cluster, name)
    raise AttributeError(name)
