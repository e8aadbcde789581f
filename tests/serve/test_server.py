"""The real worker (``nightjar-worker serve``, Nightjar scheduler, bundled pair): OpenAI API 4xx,
``/metrics`` with ``vllm:*`` and ``nightjar_*``, runtime config via file and admin endpoint.

One server for the whole module (start-up dominates: about a minute on 2 cores).
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from helpers import wait_for
from nightjar_contract.runtime import WorkerRuntimeConfig
from nightjar_worker import loadgen
from nightjar_worker.loadgen import metric_sum, parse_metrics
from nightjar_worker.runtime_config import write_config_atomically
from nightjar_worker.serve import ServerProcess

pytestmark = pytest.mark.engine

TOKEN = "test-admin-token"
PRIORS = {
    "bucket_edges": [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256],
    "entries": [{"bucket_lo": 192, "gamma": 2, "mean_loss_s": 0.0123, "count": 3.0}],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("worker")
    cfg = d / "nightjar.yaml"
    write_config_atomically(cfg, WorkerRuntimeConfig())
    srv = ServerProcess(
        ["--config", str(cfg), "--kv-cache-gib", "1"],
        env={"NIGHTJAR_ADMIN_TOKEN": TOKEN, "NIGHTJAR_STATE_DIR": str(d / "state")},
        log_path=d / "server.log",
    )
    srv.config_path = cfg
    with srv:
        yield srv


def metrics(server) -> dict:
    return parse_metrics(httpx.get(server.url + "/metrics", timeout=30).text)


def complete(server, **body):
    body = {"model": server.model_name(), "prompt": "def fibonacci(n):", "max_tokens": 24, "temperature": 0} | body
    return httpx.post(server.url + "/v1/completions", json=body, timeout=120)


def admin(server, method: str, body=None, token: str | None = TOKEN, raw: bytes | None = None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if raw is not None:
        return httpx.request(method, server.url + "/nightjar/v1/config", content=raw, headers=headers, timeout=30)
    return httpx.request(method, server.url + "/nightjar/v1/config", json=body, headers=headers, timeout=30)




def test_bad_requests_get_vllm_4xx(server):
    r = complete(server, max_tokens=-1)
    assert r.status_code == 400 and "max_tokens" in r.text
    r = complete(server, model="no-such-model")
    assert r.status_code == 404 and "no-such-model" in r.text
    r = complete(server, temperature=-0.5)
    assert r.status_code == 400 and "temperature" in r.text
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": server.model_name()}, timeout=30)
    assert 400 <= r.status_code < 500 and "messages" in r.text


def test_streamed_tokens_are_counted_and_dated(server):
    """vLLM's continuous usage stats give the load generator every chunk's token count: the token
    times bench-dynamic's per-phase figures read."""
    from openai import AsyncOpenAI

    async def go():
        async with AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
            rec = loadgen.RequestRecord(0, 0, "c", "p", start_s=0.0)
            prompt = loadgen.Prompt(0, "c", "Write three sentences about the sea.")
            return await loadgen.one_request(client, server.model_name(), prompt, rec, max_tokens=16,
                                             temperature=0.0, t_run0=time.perf_counter())

    rec = asyncio.run(go())
    assert rec.error is None and rec.output_tokens >= 2
    counts = [n for _, n in rec.token_times]
    assert len(counts) >= 2 and counts == sorted(set(counts)) and counts[-1] == rec.output_tokens
    assert rec.token_times[-1][0] <= rec.end_s + 1e-6


def test_metrics_exported_and_moving(server):
    before = metrics(server)
    for p in ("def quicksort(xs):", "The capital of France is", "Write a haiku about the sea."):
        r = complete(server, prompt=p, max_tokens=32)
        assert r.status_code == 200, r.text
    after = wait_for(lambda: (m := metrics(server)) and metric_sum(m, "nightjar_steps_total") > metric_sum(
        before, "nightjar_steps_total") and m)
    names = {n for n, _ in after}
    assert any(n.startswith("vllm:") for n in names)
    assert metric_sum(after, "vllm:generation_tokens_total") >= metric_sum(before, "vllm:generation_tokens_total") + 3
    steps = metric_sum(after, "nightjar_steps_total") - metric_sum(before, "nightjar_steps_total")
    assert steps >= 3
    assert metric_sum(after, "nightjar_gamma_chosen_count") >= steps
    assert metric_sum(after, "nightjar_batch_size_count") >= steps
    assert metric_sum(after, "nightjar_planner_decision_seconds_count") >= steps
    assert "nightjar_gamma_current" in names
    assert any(n == "nightjar_planner_loss_seconds" for n in names)
    assert any(n == "nightjar_planner_count" for n in names)
    # per-gamma labels are real gamma values
    gammas = {dict(lbl)["gamma"] for n, lbl in after if n == "nightjar_steps_total"}
    assert gammas and all(0 <= int(g) <= 4 for g in gammas)


def test_admin_requires_the_bearer_token(server):
    assert admin(server, "GET", token=None).status_code == 401
    assert admin(server, "GET", token="wrong").status_code == 401
    r = admin(server, "POST", {"slo": {"tpot_p95_ms": 50}}, token=None)
    assert r.status_code == 401 and r.headers.get("www-authenticate") == "Bearer"


@pytest.mark.parametrize(
    "raw, status, field",
    [
        (b"{not json", 400, "body"),
        (json.dumps({"slo": {"tpot_p95_ms": -1}}).encode(), 422, "slo.tpot_p95_ms"),
        (json.dumps({"planner": {"max_gamma": 2}}).encode(), 422, "planner.max_gamma"),
        (json.dumps({"plannr": {}}).encode(), 422, "plannr"),
    ],
)
def test_admin_rejects_bad_bodies_naming_the_field(server, raw, status, field):
    r = admin(server, "POST", raw=raw)
    assert r.status_code == status and field in r.json()["error"]


def test_admin_update_is_applied_in_the_engine(server):
    m0 = metrics(server)
    body = {"slo": {"tpot_p95_ms": 80}, "priors": PRIORS}
    r = admin(server, "POST", body)
    assert r.status_code == 200 and r.json()["status"] == "applied", r.text
    got = admin(server, "GET").json()
    assert got["config"]["slo"]["tpot_p95_ms"] == 80
    assert got["engine"]["applied_digest"] == r.json()["digest"] and got["engine"]["last_error"] is None
    m1 = wait_for(lambda: (m := metrics(server)) and metric_sum(
        m, "nightjar_planner_loss_seconds", bucket="192", gamma="2") > 0 and m)
    assert metric_sum(m1, "nightjar_slo_tpot_target_seconds") == pytest.approx(0.08)
    assert metric_sum(m1, "nightjar_config_reloads_total") == metric_sum(m0, "nightjar_config_reloads_total") + 1
    # the prior is the only evidence for batch bucket 192 (never reached here): its mean shows exactly
    assert metric_sum(m1, "nightjar_planner_loss_seconds", bucket="192", gamma="2") == pytest.approx(0.0123)
    assert complete(server).status_code == 200  # still serving


def test_admin_update_the_engine_cannot_apply_is_refused_and_rolled_back(server):
    before = admin(server, "GET").json()
    r = admin(server, "POST", {"planner": {"policy": "dsd"}})  # dsd needs a cost profile: the engine refuses
    assert r.status_code == 422 and "rejected by the engine" in r.json()["error"] and "dsd" in r.json()["error"]
    after = admin(server, "GET").json()
    assert after["engine"]["applied_digest"] == before["engine"]["applied_digest"]
    assert after["config"] == before["config"]  # the file was put back


def test_malformed_file_is_rejected_and_old_config_kept(server):
    m0 = metrics(server)
    tpot0 = metric_sum(m0, "nightjar_slo_tpot_target_seconds")
    server.config_path.write_text("slo:\n  tpot_p95_ms: fast\n")
    m1 = wait_for(lambda: (m := metrics(server)) and metric_sum(m, "nightjar_config_reload_failures_total") > (
        metric_sum(m0, "nightjar_config_reload_failures_total")) and m)
    assert metric_sum(m1, "nightjar_config_reload_failures_total") == metric_sum(
        m0, "nightjar_config_reload_failures_total") + 1
    assert metric_sum(m1, "nightjar_slo_tpot_target_seconds") == tpot0  # old config still in force
    st = admin(server, "GET").json()
    assert "slo.tpot_p95_ms" in st["engine"]["last_error"] and st["file_error"]
    assert "slo.tpot_p95_ms" in server.log_path.read_text()  # the clear error is in the worker's log
    # a valid file after that is applied again
    write_config_atomically(server.config_path, WorkerRuntimeConfig(slo={"tpot_p95_ms": 120}))
    assert wait_for(lambda: metric_sum(metrics(server), "nightjar_slo_tpot_target_seconds") == pytest.approx(0.12))
    assert complete(server).status_code == 200
