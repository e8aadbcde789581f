"""The worker's API key beyond vLLM's own check (nightjar_worker.apikey): with VLLM_API_KEY every path
needs the bearer token except the probes' and scrapes' (and the admin endpoint, which has its own);
vLLM 0.32 guards only /v1, /v2, /inference and /cohere and serves generation at /invocations."""

from __future__ import annotations

import httpx
import pytest
from nightjar_worker.apikey import OPEN_PATHS, ApiKeyMiddleware
from nightjar_worker.serve import APIKEY_MIDDLEWARE, build_parser, vllm_argv

KEY = "s3cret-key"


async def _app(scope, receive, send):  # what vLLM would answer: 200 on every path
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": scope["path"].encode()})


def _client(monkeypatch, key: str | None) -> httpx.AsyncClient:
    if key is None:
        monkeypatch.delenv("VLLM_API_KEY", raising=False)
    else:
        monkeypatch.setenv("VLLM_API_KEY", key)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=ApiKeyMiddleware(_app)), base_url="http://w")


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["/invocations", "/tokenize", "/detokenize", "/scale_elastic_ep", "/load",
                                  "/v1/chat/completions", "/anything"])
async def test_every_other_path_needs_the_key(monkeypatch, path):
    async with _client(monkeypatch, KEY) as c:
        r = await c.post(path, json={})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", path
        assert (await c.post(path, headers={"Authorization": "Bearer wrong"})).status_code == 401
        assert (await c.post(path, headers={"Authorization": f"Basic {KEY}"})).status_code == 401
        assert (await c.post(path, headers={"Authorization": f"Bearer {KEY}"})).status_code == 200


@pytest.mark.anyio
@pytest.mark.parametrize("path", sorted(OPEN_PATHS) + ["/nightjar/v1/config"])
async def test_probes_scrapes_and_the_admin_endpoint_stay_open(monkeypatch, path):
    assert {"/health", "/metrics"} <= OPEN_PATHS
    async with _client(monkeypatch, KEY) as c:
        assert (await c.get(path)).status_code == 200, path


@pytest.mark.anyio
async def test_without_a_key_nothing_is_asked(monkeypatch):
    async with _client(monkeypatch, None) as c:
        assert (await c.post("/invocations", json={})).status_code == 200


def test_the_worker_asks_vllm_for_the_middleware(pair):
    t, d = pair
    args, rest = build_parser().parse_known_args(["--model", str(t), "--draft", str(d)])
    av = vllm_argv(args, rest)
    middleware = [av[i + 1] for i, a in enumerate(av) if a == "--middleware"]
    assert middleware == ["nightjar_worker.admin.AdminMiddleware", APIKEY_MIDDLEWARE]
