"""Leader election on a ``coordination.k8s.io/v1`` Lease: of several operator replicas one runs kopf.

As controller-runtime does it: a replica waits as a follower until it holds the Lease, runs the
operator while it renews it, and exits when a renewal fails (the kubelet restarts it as a follower),
so two replicas never reconcile at once. The election is the kubernetes client's ``LeaderElection``
with its ``LeaseLock`` (optimistic concurrency on the Lease's resourceVersion). A follower takes over
``lease_duration_s`` after the leader's last renewal, plus at most one ``retry_period_s``.

While it waits, a follower answers the liveness URL itself (kopf serves it only once it runs), so a
standby replica is not restarted by its liveness probe.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

log = logging.getLogger("nightjar.operator.leader")


@dataclass(frozen=True)
class LeaseSettings:
    name: str
    namespace: str
    identity: str
    lease_duration_s: int = 15
    renew_deadline_s: int = 10
    retry_period_s: int = 2


def default_identity() -> str:
    """Unique per process: a restarted pod (same name) must not mistake the old holder for itself."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def default_namespace() -> str:
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:  # in a pod without the downward API variable
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip()
    except OSError:
        return "default"


class _Healthz(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"leader": false}')

    def log_message(self, *_: Any) -> None:
        pass


def _standby_liveness(url: str | None) -> ThreadingHTTPServer | None:
    if not url:
        return None
    u = urlparse(url)
    server = ThreadingHTTPServer((u.hostname or "0.0.0.0", u.port or 80), _Healthz)
    threading.Thread(target=server.serve_forever, name="standby-liveness", daemon=True).start()
    return server


def run_elected(lease: LeaseSettings, api_client: Any, lead: Callable[[threading.Event], None],
                liveness: str | None = None) -> int:
    """Block until this process holds the Lease, then ``lead(lost)``; ``lost`` is set when a renewal
    fails, and ``lead`` must then return. Returns 1 after a lost lease (the caller exits), else 0."""
    from kubernetes import client
    from kubernetes.leaderelection import electionconfig, leaderelection
    from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

    # The client logs every retry at INFO ("yet to finish lease_duration"): our own lines say it once.
    logging.getLogger("leaderelection").setLevel(logging.WARNING)
    leading, lost = threading.Event(), threading.Event()
    lock = LeaseLock(lease.name, lease.namespace, lease.identity)
    lock.api_instance = client.CoordinationV1Api(api_client)  # our identity, not the global default

    def stopped() -> None:
        log.error("lost the lease %s/%s: stopping (a restart rejoins as a follower)", lease.namespace, lease.name)
        lost.set()

    config = electionconfig.Config(
        lock, lease.lease_duration_s, lease.renew_deadline_s, lease.retry_period_s,
        onstarted_leading=leading.set, onstopped_leading=stopped,
    )  # fmt: skip
    threading.Thread(target=leaderelection.LeaderElection(config).run, name="leader-election", daemon=True).start()
    log.info("waiting for the lease %s/%s as %s", lease.namespace, lease.name, lease.identity)
    standby = _standby_liveness(liveness)
    try:
        leading.wait()
    finally:
        if standby is not None:
            standby.shutdown()
            standby.server_close()  # frees the port for kopf's liveness endpoint
    log.info("holding the lease %s/%s as %s: running the operator", lease.namespace, lease.name, lease.identity)
    lead(lost)
    return 1 if lost.is_set() else 0
