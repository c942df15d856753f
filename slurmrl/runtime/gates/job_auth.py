"""ASGI middleware for vLLM's OpenAI server: only holders of the job's secret get in.

    vllm ... --middleware slurmrl.runtime.gates.job_auth.RequireJobSecret

vLLM's own ``--api-key`` guards only paths under /v1, /v2, /inference and /cohere: its
development endpoints (``/pause``, ``/resume``, ``/collective_rpc``, ``/reset_prefix_cache``,
``/sleep``...) stay open to anyone who reaches the port. This middleware guards every path but
``OPEN`` (readiness and metrics), comparing ``Authorization: Bearer`` with the secret in
``$SLURMRL_SECRET_FILE`` (read once, at start). vllm-router forwards the client's Authorization
header to the servers, so requests through the router need the secret too.
"""

from __future__ import annotations

import hashlib
import json
import secrets

from slurmrl import secret

OPEN = ("/health", "/metrics")


class RequireJobSecret:
    def __init__(self, app) -> None:
        value = secret.read()
        if value is None:
            raise RuntimeError(f"slurmrl: ${secret.ENV} names no readable secret; the job script creates it")
        self.app = app
        self.digest = hashlib.sha256(value.encode()).digest()

    def allowed(self, scope) -> bool:
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and secrets.compare_digest(
                    hashlib.sha256(token.encode()).digest(), self.digest)
        return False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            return await self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path in OPEN or self.allowed(scope):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        body = json.dumps({"error": "this server belongs to a slurmrl job; send Authorization: Bearer <RUN_DIR/secret>"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
