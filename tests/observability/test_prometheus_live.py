"""A real Prometheus (Debian package, loopback) scrapes a target fed by the worker's real metrics
code (``metrics_target.py``: EngineControl + real Nightjar policy + config watcher, costs from the
analytic profile; no vLLM engine) with the chart's rule files loaded.

Asserted: every rule loads and evaluates without error; every dashboard query parses; every query
and recording rule whose inputs are ``nightjar_*`` worker series returns data; the reload-failure
alert really fires. Queries that need vLLM's ``vllm:*`` series are only parsed here; the engine test
and the operator test cover the rest.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from promutil import (
    RULE_FILES,
    Prometheus,
    base_metrics,
    free_port,
    has_data,
    panel_queries,
    recording_rules,
    worker_metric_names,
    worker_scrape_job,
)

pytestmark = pytest.mark.prometheus

TARGET = Path(__file__).parent / "metrics_target.py"


def _wait_http(url: str, timeout: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{TARGET.name} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer in {timeout}s")


@pytest.fixture
def worker_target(tmp_path):
    port = free_port()
    # Prometheus first (so it sees the target's counters move from their first samples), then the target.
    prom = Prometheus(tmp_path / "prom", [worker_scrape_job(port, "obs-test", "demo", "demo-0")], RULE_FILES)
    log = (tmp_path / "target.log").open("w")
    proc = subprocess.Popen([sys.executable, str(TARGET), str(port), str(tmp_path)], stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_http(f"http://127.0.0.1:{port}/metrics", 60, proc)
        yield prom, tmp_path
    finally:
        proc.terminate()
        proc.wait(10)
        prom.stop()


def test_rules_and_panels_on_worker_metrics(worker_target):
    prom, workdir = worker_target
    worker = worker_metric_names()
    # Prometheus applies new targets after up to 5 s; start the target's timed events once it scrapes.
    deadline = time.monotonic() + 30
    while not prom.query('up{job="nightjar-workers"} == 1')["result"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert [t["health"] for t in prom.targets()] == ["up"]
    time.sleep(1.5)
    (workdir / "go").touch()
    time.sleep(8)  # the target's events (switch, bad + good config, offload, reload) end 5 s after go

    # Every rule evaluated, none errored.
    rules = [r for g in prom.rule_groups() for r in g["rules"]]
    assert len(rules) == sum(1 for _ in recording_rules()) + sum(1 for r in rules if r["type"] == "alerting")
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, bad

    empty, parsed_only = [], []
    for title, expr in panel_queries():
        data = prom.query(expr)  # raises on a parse/evaluation error
        needs = base_metrics(expr)
        if needs and needs <= worker:
            if not has_data(data):
                empty.append((title, expr))
        else:
            parsed_only.append(title)
    assert not empty, "worker-only panel queries without data:\n" + "\n".join(f"{t}: {e}" for t, e in empty)

    for r in recording_rules():
        if base_metrics(r["expr"]) <= worker:
            assert has_data(prom.query(r["record"])), f"recording rule {r['record']} has no data"

    # Values that mean something: the SLO targets the worker applied (the second, valid update)...
    tpot = prom.query('nightjar:slo_tpot_target_seconds{nightjar_deployment="demo"}')["result"]
    assert [float(s["value"][1]) for s in tpot] == [0.04]
    # ...acceptance between 0 and 1 for the arms that drafted...
    acc = prom.query("nightjar:acceptance_ratio:rate5m")["result"]
    assert acc and all(0 < float(s["value"][1]) <= 1 for s in acc)
    # ...and the rejected config update raised the alert.
    firing = prom.query('ALERTS{alertname="NightjarConfigReloadFailing", alertstate="firing"}')["result"]
    assert len(firing) == 1 and firing[0]["metric"]["nightjar_deployment"] == "demo"
    print(f"{len(panel_queries()) - len(parsed_only)} panel queries returned data; "
          f"{len(parsed_only)} need vllm:* or operator series (parsed only here): {sorted(set(parsed_only))}")
