"""The API key on every path but the probes', as an ASGI middleware (``--middleware``).

vLLM's own check (``--api-key`` / env ``VLLM_API_KEY``, ``AuthenticationMiddleware``) guards only
paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere``. vLLM 0.32 also serves generation and
control outside them, unguarded: ``POST /invocations`` (SageMaker: chat and completion requests),
``/tokenize``, ``/detokenize``, ``/scale_elastic_ep``, ``/load``. With ``VLLM_API_KEY`` set, this
middleware asks the same bearer token on every path except those the kubelet, Prometheus and the
operator's fleet loop call without one (``OPEN_PATHS``) and the admin endpoint, which has its own
token (``nightjar_worker.admin``). Without ``VLLM_API_KEY`` it passes everything through.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os

ENV_KEY = "VLLM_API_KEY"
# Probes (kubelet), scrapes (Prometheus, the operator), SageMaker's health alias, the version.
OPEN_PATHS = frozenset({"/health", "/metrics", "/ping", "/version"})
ADMIN_PREFIX = "/nightjar/"


def open_path(path: str) -> bool:
    return path.rstrip("/") in OPEN_PATHS or path.startswith(ADMIN_PREFIX)


def authorized(headers: list[tuple[bytes, bytes]], key: str) -> bool:
    got = next((v.decode("latin-1") for k, v in headers if k.lower() == b"authorization"), "")
    scheme, _, token = got.partition(" ")
    # Compared as digests, as vLLM does: the comparison's time does not depend on the key's length.
    return scheme.lower() == "bearer" and hmac.compare_digest(
        hashlib.sha256(token.encode()).digest(), hashlib.sha256(key.encode()).digest())


class ApiKeyMiddleware:
    def __init__(self, app) -> None:
        self.app = app
        self.key = os.environ.get(ENV_KEY, "")

    async def __call__(self, scope, receive, send):
        if (not self.key or scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS"
                or open_path(scope["path"].removeprefix(scope.get("root_path", "")))):
            return await self.app(scope, receive, send)
        if authorized(scope.get("headers", []), self.key):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        body = json.dumps({"error": "Unauthorized"}).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
