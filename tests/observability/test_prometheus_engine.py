"""A real Prometheus scrapes the real worker (``nightjar-worker serve``: vLLM engine, Nightjar
scheduler, bundled CPU pair) under a little load, with the chart's rules loaded.

Asserted: every rule evaluates without error; every dashboard query parses; every query whose input
series the worker exports returns data unless its inputs really saw no event in the run (e.g. no
draft offload happened), which is checked, not assumed; the SLO recording rules (TTFT/TPOT
quantiles, targets, good-window flags) return data. Also runs the chart's `helm test` hook command
against the worker's real /v1/models.

The worker runs with elastic memory on (as the operator deploys it), so the draft-state and
KV-block panels have data. About 3 minutes on 2 cores (engine start-up dominates).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import yaml
from promutil import (
    CHART,
    RULE_FILES,
    Prometheus,
    base_metrics,
    has_data,
    no_events,
    panel_queries,
    worker_scrape_job,
)

pytestmark = [pytest.mark.engine, pytest.mark.prometheus]

CONFIG = {"planner": {"policy": "nightjar", "max_gamma": 3}, "slo": {"ttft_p95_ms": 5000, "tpot_p95_ms": 500}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from nightjar_worker.serve import ServerProcess, free_port

    d = tmp_path_factory.mktemp("engine-obs")
    cfg = d / "nightjar.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    port = free_port()
    prom = Prometheus(d / "prom", [worker_scrape_job(port, "obs-engine", "smollm2", "smollm2-0")], RULE_FILES)
    # Elastic memory on (policy-driven, as the operator deploys it): the draft-state and KV-block
    # panels read what the memory manager exports.
    srv = ServerProcess(["--config", str(cfg)], port=port, log_path=d / "server.log", startup_timeout_s=600,
                        env={"NIGHTJAR_MEMORY": '{"enabled": true}'})
    try:
        with srv:
            yield srv, prom
    finally:
        prom.stop()


def _complete(srv, prompt: str, max_tokens: int) -> None:
    r = httpx.post(srv.url + "/v1/completions", timeout=180, json={
        "model": srv.model_name(), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    r.raise_for_status()


def test_dashboard_and_rules_on_real_worker(stack):
    srv, prom = stack
    deadline = time.monotonic() + 30
    while not prom.query('up{job="nightjar-workers"} == 1')["result"] and time.monotonic() < deadline:
        time.sleep(0.5)
    prompts = ["def fibonacci(n):", "The capital of France is", "Write a haiku about the sea.", "import numpy as np\n"]
    # Low load, then a burst, then low again: batch size and gamma move.
    for p in prompts[:2]:
        _complete(srv, p, 16)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: _complete(srv, prompts[i % 4], 24), range(8)))
    _complete(srv, prompts[0], 16)
    time.sleep(4)  # two more scrapes and rule evaluations

    rules = [r for g in prom.rule_groups() for r in g["rules"]]
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, bad

    exported = set(prom.http.get("/api/v1/label/__name__/values").json()["data"])
    data, quiet, missing = [], [], []
    for title, expr in panel_queries():
        res = prom.query(expr)
        needs = base_metrics(expr)
        if not needs <= exported:
            missing.append((title, sorted(needs - exported)))
            continue
        if has_data(res):
            data.append(title)
        elif no_events(prom, needs):
            quiet.append(title)
        else:
            pytest.fail(f"{title}: inputs moved but the query returned nothing: {expr}")
    # Operator panels need the operator (tests/chart/test_install.py scrapes it); all else the worker exports.
    assert all(any("nightjar_operator_" in m for m in ms) for _, ms in missing), missing
    for rec in ("nightjar:ttft_seconds:p95_5m", "nightjar:tpot_seconds:p95_5m", "nightjar:slo_tpot_target_seconds",
                "nightjar:generation_tokens:rate5m", "nightjar:gamma:mean5m", "nightjar:requests_running:sum"):
        assert has_data(prom.query(rec)), rec
    ok = prom.query('nightjar:slo_ok:5m{objective="ttft"}')["result"]
    assert ok and ok[0]["value"][1] in ("0", "1")
    for needed in ("TTFT p50 / p95 / p99 vs target", "TPOT p50 / p95 / p99 vs target", "Output tokens / s",
                   "Gamma over time", "Steps / s per arm", "Requests waiting / running", "KV blocks: total and gained from the draft",
                   "Suffix trees: memory and cached outputs"):
        assert needed in data, needed
    print(f"\nreal worker: {len(set(data))} panels with data; quiet (no event in the run): {sorted(set(quiet))}; "
          f"operator-only: {sorted({t for t, _ in missing})}")


def test_helm_test_hook_against_real_worker(stack):
    """The chart's `helm test` pod command, run here against the worker's real /v1/models."""
    srv, _ = stack
    text = (CHART / "templates/tests/test-worker-models.yaml").read_text()
    script = textwrap.dedent(text.split("        - |\n", 1)[1].split("      args:", 1)[0])  # plain Python, no templating
    ok = subprocess.run([sys.executable, "-c", script, srv.url + "/v1/models", "30"], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.startswith("OK ") and srv.model_name() in ok.stdout, ok.stdout + ok.stderr
    bad = subprocess.run([sys.executable, "-c", script, "http://127.0.0.1:9/v1/models", "2"], capture_output=True, text=True)
    assert bad.returncode != 0 and "FAIL" in bad.stderr
