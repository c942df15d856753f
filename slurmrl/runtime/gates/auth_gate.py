"""``python -m slurmrl.runtime.gates.auth_gate --listen HOST:PORT --upstream PORT -- COMMAND...``

Runs COMMAND (vllm-router, listening on 127.0.0.1:UPSTREAM) and serves HOST:PORT in front of it:
every request but ``/health`` and ``/metrics`` needs ``Authorization: Bearer`` with the job's
secret (``$SLURMRL_SECRET_FILE``), then goes to the router unchanged, responses streamed back
as they come (SSE included). vllm-router (0.1.17) checks no credential on its management routes
(``/add_worker``, ``/remove_worker``, ``/flush_cache``...) even with ``--api-key``: without this
gate anyone who reaches the port could point the job's traffic at a server of their own.

The gate exits with COMMAND's exit code when COMMAND ends, and ends COMMAND (TERM, then KILL)
when it is told to stop; the supervisor above ends whatever is left of the tree.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import signal
import subprocess
import sys

from slurmrl import secret
from slurmrl.contract.argv import AuthGate

OPEN = ("/health", "/metrics")
HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
       "transfer-encoding", "upgrade", "host", "content-length"}
DENIED = b'{"error": "this router belongs to a slurmrl job; send Authorization: Bearer <RUN_DIR/secret>"}'


def allowed(header: str | None, digest: bytes) -> bool:
    scheme, _, token = (header or "").partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(hashlib.sha256(token.encode()).digest(), digest)


def make_app(upstream: str, digest: bytes):
    from aiohttp import ClientSession, ClientTimeout, web

    async def session(app):
        app["client"] = ClientSession(timeout=ClientTimeout(total=None, sock_connect=30), auto_decompress=False)
        yield
        await app["client"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        if request.path not in OPEN and not allowed(request.headers.get("Authorization"), digest):
            return web.Response(status=401, body=DENIED, content_type="application/json")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        body = await request.read() if request.body_exists else None  # requests are small; responses stream
        try:
            async with request.app["client"].request(
                request.method, upstream + str(request.rel_url),
                headers=headers, data=body, allow_redirects=False,
            ) as up:
                out = web.StreamResponse(status=up.status, reason=up.reason,
                                         headers={k: v for k, v in up.headers.items() if k.lower() not in HOP})
                await out.prepare(request)
                async for chunk in up.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out
        except OSError as e:  # the router is not (or no longer) listening
            return web.Response(status=502, text=f"slurmrl gate: router unreachable: {e}")

    app = web.Application(client_max_size=0)
    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


async def serve(host: str, port: int, upstream: int, command: list[str], digest: bytes) -> int:
    from aiohttp import web

    child = subprocess.Popen(command)
    runner = web.AppRunner(make_app(f"http://127.0.0.1:{upstream}", digest), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        while child.poll() is None and not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except TimeoutError:
                pass
    finally:
        await runner.cleanup()
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    code = child.returncode
    return 128 + signal.SIGTERM if stop.is_set() and code in (None, 0, -signal.SIGTERM) else (
        128 - code if code < 0 else code)


def main(argv: list[str] | None = None) -> int:
    a = AuthGate.parse(sys.argv[1:] if argv is None else argv, description=__doc__.split("\n\n")[1])
    command = list(a.command)
    host, _, port = a.listen.rpartition(":")
    value = secret.read()
    if value is None:
        raise SystemExit(f"slurmrl: ${secret.ENV} names no readable secret; the job script creates it")
    digest = hashlib.sha256(value.encode()).digest()
    return asyncio.run(serve(host or "0.0.0.0", int(port), int(a.upstream), command, digest))


if __name__ == "__main__":
    sys.exit(main())
