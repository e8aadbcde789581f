"""Observability test helpers: the chart's rule files and dashboard queries, the metric names the
project really exports (worker, operator, vLLM 0.32), and a real Prometheus on loopback."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml
from helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "nightjar"
RULE_FILES = sorted((CHART / "rules").glob("*.yaml"))
DASHBOARDS = sorted((CHART / "dashboards").glob("*.json"))
METRIC_RE = re.compile(r"\b(nightjar[a-z0-9_:]*|vllm:[a-z0-9_:]+)")

# The chart's PodMonitor metricRelabelings, as a Prometheus metric_relabel_configs entry: the tests'
# Prometheus scrapes the way the chart's PodMonitor does (tests/chart checks the two agree).
WORKER_METRIC_RELABEL = [
    {"source_labels": ["__name__"], "regex": "vllm_(.+)", "target_label": "__name__", "replacement": "vllm:$1"},
]

# What Grafana substitutes, for running the panel queries against a plain Prometheus.
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m", "$namespace": ".*", "$deployment": ".*"}


def worker_scrape_job(port: int, namespace: str, deployment: str, pod: str) -> dict[str, Any]:
    """The chart's worker scrape job for one target on loopback, with the labels the rules group by."""
    return {
        "job_name": "nightjar-workers", "metric_relabel_configs": WORKER_METRIC_RELABEL,
        "static_configs": [{"targets": [f"127.0.0.1:{port}"],
                            "labels": {"namespace": namespace, "nightjar_deployment": deployment, "pod": pod}}],
    }


def rules() -> list[dict[str, Any]]:
    return [r for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]]


def recording_rules() -> list[dict[str, Any]]:
    return [r for r in rules() if "record" in r]


def panels() -> Iterator[tuple[str, dict[str, Any]]]:
    for f in DASHBOARDS:
        for p in json.loads(f.read_text())["panels"]:
            if p["type"] != "row":
                yield f.name, p


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, query with Grafana's variables substituted)."""
    out = []
    for _, p in panels():
        for t in p["targets"]:
            expr = t["expr"]
            for k, v in GRAFANA_VARS.items():
                expr = expr.replace(k, v)
            out.append((p["title"], expr))
    return out


_NOT_NAMES = re.compile(r'"[^"]*"|\{[^}]*\}|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)')


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression reads (label matchers, grouping clauses and strings removed)."""
    return set(METRIC_RE.findall(_NOT_NAMES.sub(" ", expr)))


# ------------------------------------------------------------------------------- exported names
def _suffixed(base: str, kind: str) -> set[str]:
    if kind == "counter":
        return {base if base.endswith("_total") else base + "_total"}
    if kind == "histogram":
        return {base + s for s in ("_bucket", "_sum", "_count")}
    return {base}


def worker_metric_names() -> set[str]:
    import nightjar_worker.metrics as m
    from prometheus_client import Counter, Gauge, Histogram

    out: set[str] = set()
    for v in vars(m).values():
        for cls, kind in ((Counter, "counter"), (Histogram, "histogram"), (Gauge, "gauge")):
            if isinstance(v, cls):
                out |= _suffixed(v._name, kind)
    return out


def operator_metric_names() -> set[str]:
    from nightjar_operator.metrics import OperatorMetrics, op_metrics
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    OperatorMetrics(registry=reg)
    out: set[str] = set()
    for fam in reg.collect():
        out |= _suffixed(fam.name, fam.type)
    for metric in op_metrics().values():  # the fleet loop's (default registry)
        out |= {s.name for s in metric.collect()[0].samples} | _suffixed(metric._name, metric._type)
    return out


def vllm_metric_names() -> set[str]:
    """Names vLLM 0.32's Prometheus stat logger defines (read from its source; type from the class)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")  # locate without importing (importing vLLM takes seconds)
    assert spec is not None and spec.origin, "vllm is not installed"
    base = Path(spec.origin).parent
    out: set[str] = set()
    for rel in ("v1/metrics/loggers.py", "v1/spec_decode/metrics.py"):
        src = (base / rel).read_text()
        for m in re.finditer(r"(_counter_cls|_gauge_cls|_histogram_cls|Counter|Gauge|Histogram)\(\s*name=\"(vllm:[a-z0-9_]+)\"", src):
            cls, name = m.groups()
            kind = "counter" if "ounter" in cls else "histogram" if "istogram" in cls else "gauge"
            out |= _suffixed(name, kind)
        # spec-decode counters are declared as (name, documentation) pairs
        for m in re.finditer(r"\(\"(vllm:spec_decode_[a-z0-9_]+)\",", src):
            out |= _suffixed(m.group(1), "counter")
    return out


def recorded_names() -> set[str]:
    return {r["record"] for r in recording_rules()}


# ------------------------------------------------------------------------------- live Prometheus


class Prometheus:
    """A real Prometheus (Debian package) on loopback with a generated config."""

    def __init__(self, workdir: Path, scrape_configs: list[dict[str, Any]], rule_files: list[Path]) -> None:
        exe = shutil.which("prometheus")
        if exe is None:
            raise RuntimeError("prometheus not found: run `make prometheus` (Debian package `prometheus`)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        cfg = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": scrape_configs,
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.log = workdir / "prometheus.log"
        self.proc = subprocess.Popen(
            [exe, f"--config.file={self.config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h",
             "--web.enable-lifecycle", "--log.level=warn"],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT,
        )
        self.http = httpx.Client(base_url=self.url, timeout=10, trust_env=False)
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.http.get("/-/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def query(self, expr: str) -> dict[str, Any]:
        r = self.http.get("/api/v1/query", params={"query": expr})
        body = r.json()
        if body.get("status") != "success":
            raise AssertionError(f"query failed: {expr}\n{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def targets(self) -> list[dict[str, Any]]:
        return self.http.get("/api/v1/targets").json()["data"]["activeTargets"]

    def rule_groups(self) -> list[dict[str, Any]]:
        return self.http.get("/api/v1/rules").json()["data"]["groups"]

    def stop(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def has_data(data: dict[str, Any]) -> bool:
    """A non-empty result with at least one finite value."""
    res = data["result"]
    if data["resultType"] == "scalar":
        return res[1] not in ("NaN", "+Inf", "-Inf")
    return any(s["value"][1] not in ("NaN", "+Inf", "-Inf") for s in res)


def base_metrics(expr: str, _depth: int = 0) -> set[str]:
    """Raw metric names an expression depends on, recording rules resolved to their sources."""
    by_record: dict[str, list[str]] = {}
    for r in recording_rules():
        by_record.setdefault(r["record"], []).append(r["expr"])
    out: set[str] = set()
    for n in metric_names(expr):
        if n in by_record and _depth < 10:
            for e in by_record[n]:
                out |= base_metrics(e, _depth + 1)
        else:
            out.add(n)
    return out


def no_events(prom: Prometheus, names: set[str]) -> bool:
    """True when none of the counters/histograms behind a query moved during the run."""
    for n in names:
        base = n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
        probe = f"{base}_count" if n != base else n
        if probe.endswith("_total") or probe.endswith("_count"):
            res = prom.query(f"sum(increase({probe}[10m]))")["result"]
            if res and float(res[0]["value"][1]) > 0:
                return False
        else:  # a gauge: present means there is data to show
            if prom.query(probe)["result"]:
                return False
    return True
