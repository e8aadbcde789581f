"""Admin endpoint ``/nightjar/v1/config`` as a plain ASGI middleware.

vLLM's API server takes extra middleware by import path (``--middleware
nightjar_worker.admin.AdminMiddleware``), so the endpoint is added without patching vLLM. It runs in
the API server process, which does not hold the policy: ``POST`` validates the body as a
``WorkerRuntimeConfig``, refuses fields a live engine cannot change, and atomically rewrites the
watched config file; the ``RuntimeConfigWatcher`` in the EngineCore then applies it. The response
waits (briefly) until the engine reports the new digest as applied.

Auth: ``Authorization: Bearer <token>`` equal to env ``NIGHTJAR_ADMIN_TOKEN`` (401 otherwise; 403
when no token is configured: the endpoint is disabled). Bad bodies: 400 (not JSON) or 422 (a field
is invalid), the reason names the field.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import time
from pathlib import Path
from typing import Any

from nightjar_contract.runtime import RuntimeConfigError, parse_runtime_config

from nightjar_worker.runtime_config import (
    check_live_update,
    config_path_from_env,
    load_runtime_config,
    read_status,
    write_config_atomically,
    write_text_atomically,
)

PATH = "/nightjar/v1/config"
ENV_TOKEN = "NIGHTJAR_ADMIN_TOKEN"
APPLY_WAIT_S = 10.0
MAX_BODY = 1 << 20


async def _send_json(send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None):
    data = json.dumps(body).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": hdrs + (headers or [])})
    await send({"type": "http.response.body", "body": data})


async def _read_body(receive) -> bytes:
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            break
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise RuntimeConfigError(f"body: larger than {MAX_BODY} bytes")
        chunks.append(chunk)
        if not msg.get("more_body", False):
            break
    return b"".join(chunks)


def authorize(headers: list[tuple[bytes, bytes]]) -> tuple[int, str] | None:
    """None if authorised, else (status, reason)."""
    token = os.environ.get(ENV_TOKEN, "")
    if not token:
        return 403, f"admin endpoint disabled: the worker was started without {ENV_TOKEN}"
    got = ""
    for k, v in headers:
        if k.lower() == b"authorization":
            got = v.decode("latin-1")
    scheme, _, cred = got.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(cred.strip().encode(), token.encode()):
        return 401, "missing or wrong bearer token (Authorization: Bearer $NIGHTJAR_ADMIN_TOKEN)"
    return None


class AdminMiddleware:
    """ASGI middleware serving ``GET``/``POST /nightjar/v1/config``; everything else passes through."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].rstrip("/") != PATH:
            return await self.app(scope, receive, send)
        denied = authorize(scope.get("headers", []))
        if denied is not None:
            status, reason = denied
            extra = [(b"www-authenticate", b"Bearer")] if status == 401 else None
            return await _send_json(send, status, {"error": reason}, extra)
        method = scope["method"]
        if method == "GET":
            return await _send_json(send, 200, self._get())
        if method == "POST":
            status, body = await self._post(receive)
            return await _send_json(send, status, body)
        return await _send_json(send, 405, {"error": f"method {method} not allowed (GET or POST)"})

    @staticmethod
    def _get() -> dict[str, Any]:
        path = config_path_from_env()
        try:
            cfg = load_runtime_config(path).model_dump(mode="json", exclude_none=True)
            err = None
        except RuntimeConfigError as e:
            cfg, err = None, str(e)
        return {"path": path, "config": cfg, "file_error": err, "engine": read_status()}

    @staticmethod
    async def _post(receive) -> tuple[int, dict[str, Any]]:
        try:
            raw = await _read_body(receive)
        except RuntimeConfigError as e:
            return 413, {"error": str(e)}
        try:
            data = json.loads(raw or b"null")
        except ValueError as e:
            return 400, {"error": f"body: not valid JSON: {e}"}
        try:
            new = parse_runtime_config(data)
        except RuntimeConfigError as e:
            return 422, {"error": str(e)}
        path = config_path_from_env()
        try:
            current = load_runtime_config(path)
        except RuntimeConfigError:
            current = None  # a broken file on disk is being replaced: nothing to compare with
        status = read_status()
        if status and status.get("applied"):
            try:
                current = parse_runtime_config(status["applied"])
            except RuntimeConfigError:
                pass
        if current is not None:
            try:
                check_live_update(current, new)
            except RuntimeConfigError as e:
                return 422, {"error": str(e)}
        if (Path(path).exists() and not os.access(path, os.W_OK)) or not os.access(Path(path).parent, os.W_OK):
            return 409, {
                "error": f"config file {path} is read-only (a mounted ConfigMap?): update the ConfigMap instead"
            }
        previous = Path(path).read_text() if Path(path).exists() else None
        t_write = time.time()
        write_config_atomically(path, new)
        digest = new.digest()
        outcome, err = await _wait_applied(digest, t_write)
        if outcome == "rejected":
            # The engine kept its config; put the file back so file and engine agree.
            if previous is not None:
                write_text_atomically(path, previous)
            return 422, {"error": f"rejected by the engine: {err}"}
        return 200, {"status": outcome, "digest": digest, "path": path}


async def _wait_applied(digest: str, since: float) -> tuple[str, str | None]:
    """Poll the engine's status file: ("applied", None), ("rejected", error) or ("written", None)
    when no engine reported within ``APPLY_WAIT_S``."""
    if not os.environ.get("NIGHTJAR_STATE_DIR"):
        return "written", None
    deadline = time.monotonic() + APPLY_WAIT_S
    while time.monotonic() < deadline:
        st = read_status()
        if st and st.get("applied_digest") == digest:
            return "applied", None
        if st and st.get("last_error") and st.get("applied_at", 0) >= since:
            return "rejected", st["last_error"]
        await asyncio.sleep(0.1)
    return "written", None
