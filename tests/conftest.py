"""Session-wide fixtures shared by every area (owner: cluster harness).

``k8s``: a real loopback Kubernetes 1.20 control plane (etcd, kube-apiserver, controller-manager,
scheduler) plus the node agent, started once per session on first use
(:class:`nightjar_operator.testing.cluster.LocalCluster`). Containers never run there: the node agent
reports pods Running/Ready and gives them 127.0.0.x IPs. While the session cluster is up,
``os.environ["KUBECONFIG"]`` points at its admin kubeconfig (so kopf's ``KopfRunner`` and the
kubernetes client find it).

``namespace``: a fresh namespace per test (default ServiceAccount token ready), deleted afterwards.

Nothing here starts or imports anything until a test asks for these fixtures; tests using them are
marked ``cluster`` automatically. ``NIGHTJAR_K8S_REUSE=1`` attaches to a cluster from
``make cluster-up`` instead of starting one (faster edit-test loops).
"""

from __future__ import annotations

import os
import re
import uuid
import warnings

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if {"k8s", "namespace"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)


_ENGINE_KNOBS = ("NIGHTJAR_", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE")


@pytest.fixture(autouse=True, scope="module")
def _no_engine_knob_leaks():
    """A module must leave the engine's environment knobs as it found them: worker subprocesses
    started later inherit ``os.environ`` (a leaked ``NIGHTJAR_FORCE_GAMMA`` silently replaced the
    planner in every later server test)."""

    def knobs() -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k.startswith(_ENGINE_KNOBS)}

    before = knobs()
    yield
    after = knobs()
    if after != before:
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        for k in changed:  # restore, so one leak is reported once and not in every later module
            if k in before:
                os.environ[k] = before[k]
            else:
                os.environ.pop(k, None)
        pytest.fail(f"this module leaked engine environment variables: {', '.join(changed)}", pytrace=False)


@pytest.fixture(scope="session")
def k8s():
    from nightjar_operator.testing.cluster import (
        DEFAULT_STATE_DIR,
        LocalCluster,
        missing_binaries,
        stale_build,
    )

    stale = stale_build()
    if stale:
        warnings.warn(stale, stacklevel=1)

    if os.environ.get("NIGHTJAR_K8S_REUSE") == "1":
        cluster = LocalCluster.attach(os.environ.get("NIGHTJAR_K8S_STATE_DIR", DEFAULT_STATE_DIR))
        owned = False
    else:
        missing = missing_binaries()
        if missing:
            pytest.fail(
                f"the test cluster needs {', '.join(missing)}: run `make cluster-build` (and `make helm`) "
                "first; `make test` does it",
                pytrace=False,
            )
        cluster = LocalCluster().start()
        owned = True
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = cluster.kubeconfig
    try:
        yield cluster
    finally:
        if old is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old
        if owned:
            cluster.stop()


@pytest.fixture
def namespace(k8s, request):
    """Name of a fresh namespace whose default ServiceAccount is ready; deleted (not awaited) after."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{base}-{uuid.uuid4().hex[:6]}"
    k8s.create_namespace(name)
    yield name
    k8s.delete_namespace(name)


@pytest.fixture(scope="session")
def crd(k8s):
    """The checked-in NightjarDeployment CRD, applied once and Established (shared by cluster tests)."""
    from pathlib import Path

    from nightjar_operator import constants as c

    crd_file = Path(__file__).resolve().parents[1] / "manifests/crds/nightjar.dev_nightjardeployments.yaml"
    k8s.kubectl("apply", "-f", str(crd_file))
    k8s.kubectl("wait", "--for=condition=Established", f"crd/{c.CRD_NAME}", "--timeout=30s")
    return c.CRD_NAME


@pytest.fixture(scope="session")
def routing_crds(k8s):
    """Stand-ins for the Gateway API HTTPRoute and Inference Extension InferencePool CRDs
    (tests/fixtures/routing-crds.yaml), applied once and Established."""
    from pathlib import Path

    k8s.kubectl("apply", "-f", str(Path(__file__).resolve().parent / "fixtures/routing-crds.yaml"))
    for name in ("inferencepools.inference.networking.k8s.io", "httproutes.gateway.networking.k8s.io"):
        k8s.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=30s")
