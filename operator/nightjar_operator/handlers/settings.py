"""Operator start-up: kopf settings and the shared API client (``memo.api``)."""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf

from nightjar_operator import constants as c
from nightjar_operator import metrics as metrics_mod
from nightjar_operator.handlers.k8s import Api, make_api_client
from nightjar_operator.reconcile.validate import PodPolicy

ENV_METRICS_PORT = "NIGHTJAR_OPERATOR_METRICS_PORT"
# Volume types (and "serviceAccountToken" for projected volumes) a cluster admin allows CRs beyond
# the default allowlist: chart value operator.podPolicy.extraVolumeTypes.
ENV_EXTRA_VOLUME_TYPES = "NIGHTJAR_POD_EXTRA_VOLUME_TYPES"


def pod_policy() -> PodPolicy:
    """The admin's pod policy; the reconcile and the admission webhook read the same one."""
    return PodPolicy.parse(os.environ.get(ENV_EXTRA_VOLUME_TYPES))


def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
    """Credentials for kopf from the same source as our client (in-cluster, else ``$KUBECONFIG`` read now).

    kopf's default ``login_via_client`` loads the kubeconfig the kubernetes package located at its
    import time; reading the path at login keeps the operator and its own API client on one identity.
    """
    cfg = make_api_client().configuration
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        username=cfg.username or None,
        password=cfg.password or None,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        trust_env=settings.networking.trust_env,
    )


def configure(settings: kopf.OperatorSettings, memo: Any, logger: logging.Logger) -> None:
    # Progress and the diff base live in annotations under our group, not in status.kopf: the
    # structural schema would prune an unknown status field, and status belongs to the reconcile.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=c.GROUP, key="last-handled-configuration"
    )
    # No finalizers from us (children are garbage-collected via ownerReferences).
    settings.persistence.finalizer = f"{c.GROUP}/operator"
    # Events: only the explicit ones the reconcile posts (Created/Updated/InvalidSpec/Ready).
    settings.posting.enabled = True
    settings.posting.level = logging.INFO
    settings.posting.reporting_component = c.OPERATOR_NAME
    # One operator replica (the Deployment uses strategy Recreate): no peering objects to watch.
    settings.peering.standalone = True
    # Reconnect promptly if a watch goes silent; do not wait forever on a stuck request.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10
    # Sync handlers (the reconciles) run on kopf's thread pool (default min(32, cores + 4): 6 on a
    # 2-core node). They mostly wait on the apiserver, so more threads than cores pay off. The fleet
    # loop has its own bounded pool (NIGHTJAR_FLEET_TICK_WORKERS).
    settings.execution.max_workers = int(os.environ.get("NIGHTJAR_OPERATOR_WORKERS", "16"))
    memo.api = Api(make_api_client())
    port = int(os.environ.get(ENV_METRICS_PORT, "0") or 0)
    if port:
        metrics_mod.serve(port)
        logger.info("operator metrics on :%d/metrics", port)
