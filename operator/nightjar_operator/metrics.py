"""Operator Prometheus metrics (prefix ``nightjar_operator_``, base units, ``_total`` on counters).

Served by ``nightjar-operator run`` on ``--metrics-port`` (default 8080, 0 = off).
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_lock = threading.Lock()
_metrics: OperatorMetrics | None = None


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.reconciles = Counter(
            "nightjar_operator_reconciles_total",
            "Reconciles of NightjarDeployments by trigger and result (ok|invalid|conflict|error)",
            ["trigger", "result"],
            registry=registry,
        )
        self.reconcile_errors = Counter(
            "nightjar_operator_reconcile_errors_total",
            "Reconciles that failed (API errors, conflicts), by reason",
            ["reason"],
            registry=registry,
        )
        self.reconcile_seconds = Histogram(
            "nightjar_operator_reconcile_duration_seconds",
            "Wall time of one reconcile",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.child_writes = Counter(
            "nightjar_operator_child_writes_total",
            "Writes to child objects (an idempotent reconcile of an unchanged spec writes nothing)",
            ["kind", "action"],
            registry=registry,
        )
        self.child_conflicts = Counter(
            "nightjar_operator_child_conflicts_total",
            "Reconciles that found a child's name taken by an object the operator did not create (left "
            "untouched; Degraded=Conflict)",
            ["kind"],
            registry=registry,
        )
        self.admission_reviews = Counter(
            "nightjar_operator_admission_reviews_total",
            "Admission reviews of NightjarDeployments by operation and decision (valid|invalid|"
            "unchanged-spec|deleting|not-checked; invalid ones were refused)",
            ["operation", "decision"],
            registry=registry,
        )
        self.webhook_certificates = Counter(
            "nightjar_operator_webhook_certificates_total",
            "Operator-managed webhook serving certificates written to their Secret (created|renewed)",
            ["action"],
            registry=registry,
        )
        self.status_writes = Counter(
            "nightjar_operator_status_writes_total",
            "Status patches of NightjarDeployments (only written when the status changed)",
            registry=registry,
        )
        self.invalid_specs = Counter(
            "nightjar_operator_invalid_specs_total",
            "Reconciles that found a semantically invalid spec (Ready=False, reason=InvalidSpec)",
            registry=registry,
        )
        self.ready = Gauge(
            "nightjar_operator_deployment_ready",
            "1 when the NightjarDeployment's Ready condition is True",
            ["namespace", "name"],
            registry=registry,
        )
        self.replicas = Gauge(
            "nightjar_operator_deployment_replicas",
            "Worker replicas of a NightjarDeployment by kind (desired|ready)",
            ["namespace", "name", "kind"],
            registry=registry,
        )
        self.leader = Gauge(
            "nightjar_operator_leader",
            "1 while this replica operates (holds the Lease, or runs without leader election), 0 while it "
            "stands by; every replica serves /metrics",
            registry=registry,
        )

        self.fleet_objects = Gauge(
            "nightjar_operator_fleet_objects", "NightjarDeployments the fleet loop ticks each round", registry=registry
        )
        self.fleet_round_seconds = Gauge(
            "nightjar_operator_fleet_round_seconds",
            "Wall time of the fleet loop's last round over every object (above the interval: it is behind)",
            registry=registry,
        )
        self.fleet_tick_failures = Counter(
            "nightjar_operator_fleet_tick_failures_total", "Fleet ticks that raised (the round goes on)",
            ["namespace", "deployment"], registry=registry,
        )

    def forget(self, namespace: str, name: str) -> None:
        for labels in ((namespace, name),):
            try:
                self.ready.remove(*labels)
            except KeyError:
                pass
        for kind in ("desired", "ready"):
            try:
                self.replicas.remove(namespace, name, kind)
            except KeyError:
                pass


def metrics() -> OperatorMetrics:
    """Process-wide metrics (created once: prometheus_client refuses duplicate registration)."""
    global _metrics
    with _lock:
        if _metrics is None:
            _metrics = OperatorMetrics()
        return _metrics


_server_started: set[int] = set()


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Expose /metrics once per port (the operator may restart its kopf loop in-process in tests)."""
    if port <= 0 or port in _server_started:
        return
    start_http_server(port, addr=addr)
    _server_started.add(port)


_M: dict[str, Any] = {}


def op_metrics() -> dict[str, Any]:
    """Operator metrics of the fleet loop (default registry, served with the operator's others)."""
    if not _M:
        lbl = ["namespace", "deployment"]
        _M["scrape_failures"] = Counter(
            "nightjar_operator_scrape_failures_total", "Worker /metrics scrapes that failed", lbl
        )
        _M["scrapes"] = Counter("nightjar_operator_scrapes_total", "Worker /metrics scrapes attempted", lbl)
        _M["pods_scraped"] = Gauge("nightjar_operator_fleet_pods_scraped", "Pods scraped successfully in the last tick", lbl)
        _M["attainment"] = Gauge(
            "nightjar_operator_slo_attainment_ratio", "Fraction of the window's requests within the SLO targets", lbl
        )
        _M["attainment_target"] = Gauge(
            "nightjar_operator_slo_attainment_target",
            "The objective spec.slo.attainment (0..1): the SLO burn-rate alerts' error budget is 1 minus it", lbl
        )
        _M["slo_met"] = Gauge("nightjar_operator_slo_met", "1 when SLOMet is True, 0 when False, -1 when Unknown", lbl)
        _M["ttft_p95"] = Gauge("nightjar_operator_ttft_p95_seconds", "Fleet TTFT p95 over the SLO window", lbl)
        _M["tpot_p95"] = Gauge("nightjar_operator_tpot_p95_seconds", "Fleet TPOT p95 over the SLO window", lbl)
        _M["throughput"] = Gauge(
            "nightjar_operator_fleet_generation_tokens_per_second", "Fleet generated tokens per second", lbl
        )
        _M["priors_pushes"] = Counter(
            "nightjar_operator_priors_pushes_total", "Priors written into a worker ConfigMap", lbl + ["track"]
        )
        _M["rollout_decisions"] = Counter(
            "nightjar_operator_rollout_decisions_total", "Rollout decisions by action", lbl + ["action"]
        )
        _M["candidate_weight"] = Gauge(
            "nightjar_operator_rollout_candidate_weight_ratio", "Candidate share of the replicas (0..1)", lbl
        )
    return _M
