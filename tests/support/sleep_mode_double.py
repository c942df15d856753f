"""Test double: a loopback HTTP server standing in for a vLLM server started with
``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``. vLLM's sleep mode needs CUDA (the CPU
build refuses the flag), so no real server can sleep on this machine.

It answers the routes slurmrl uses, the way vLLM 0.32's do (vllm/entrypoints/serve/dev/sleep/
api_router.py, dev/rpc, the OpenAI completions route): ``POST /sleep?level=&mode=``,
``POST /wake_up?tags=`` (repeatable), ``GET /is_sleeping``, ``POST /collective_rpc``,
``/pause``, ``/resume``, ``/reset_prefix_cache``, ``/v1/completions`` (token ids and logprobs),
and ``/health``. Everything but /health needs ``Authorization: Bearer <secret>`` (the job's gate).
It keeps vLLM's state rules strictly, so a wrong order fails: a level-2 sleep drops the weights
and the KV cache; reload_weights needs the weights' memory awake; completions need the engine
fully awake; the scheduler resumes only once every tag is awake. Every call is recorded in ``events``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from json_reply import send_json


class SleepModeDouble:
    def __init__(self, secret: str):
        self.secret = secret
        self.events: list[tuple] = []
        self.awake = {"weights": True, "kv_cache": True}
        self.paused = False
        self.weights = "base"
        self.lock = threading.Lock()
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            reply = send_json

            def handle_any(self, method: str) -> None:
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null") if length else None
                if url.path != "/health" and self.headers.get("Authorization") != f"Bearer {double.secret}":
                    return self.reply(401, {"error": "no secret"})
                with double.lock:
                    code, out = double.route(method, url.path, query, body)
                self.reply(code, out)

            def do_GET(self):
                self.handle_any("GET")

            def do_POST(self):
                self.handle_any("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    @property
    def sleeping(self) -> bool:  # vLLM: the scheduler is paused or any memory is asleep
        return self.paused or not all(self.awake.values())

    def route(self, method: str, path: str, query: dict, body) -> tuple[int, dict]:
        if method == "GET" and path == "/health":
            return 200, {}
        if method == "GET" and path == "/is_sleeping":
            return 200, {"is_sleeping": self.sleeping}
        if method != "POST":
            return 404, {"error": path}
        if path == "/sleep":
            level = int(query.get("level", ["1"])[0])
            self.events.append(("sleep", level, query.get("mode", ["abort"])[0]))
            self.paused = True
            if level >= 1:
                self.awake = {"weights": False, "kv_cache": False}
                if level == 2:
                    self.weights = None  # discarded, not offloaded
            return 200, {"status": "sleeping", "level": level}
        if path == "/wake_up":
            tags = query.get("tags") or list(self.awake)
            self.events.append(("wake_up", tuple(tags)))
            for t in tags:
                self.awake[t] = True
            if all(self.awake.values()):
                self.paused = False
            return 200, {"status": "sleeping" if self.sleeping else "awake", "tags": tags}
        if path == "/collective_rpc":
            if body.get("method") != "reload_weights":
                return 400, {"error": f"unknown method {body.get('method')}"}
            if not self.awake["weights"]:
                return 500, {"error": "reload_weights into memory that is asleep"}
            self.weights = body["kwargs"]["weights_path"]
            self.events.append(("reload_weights", self.weights))
            return 200, {"results": [None]}
        if path in ("/pause", "/resume", "/reset_prefix_cache"):
            self.events.append((path[1:],))
            self.paused = path == "/pause" or (self.paused and path != "/resume")
            return 200, {}
        if path == "/v1/completions":
            if self.sleeping or self.weights is None:
                return 503, {"error": f"asleep (awake: {self.awake}, weights {self.weights})"}
            self.events.append(("completions", self.weights))
            n = body.get("n", 1)
            choice = {"text": "ab", "logprobs": {"tokens": ["token_id:10", "token_id:11"],
                                                 "token_logprobs": [-0.5, -0.7]}}
            return 200, {"choices": [choice] * n}
        return 404, {"error": path}
