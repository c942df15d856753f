"""Test double for a vLLM server that a test kills by pid: its own process, answering the routes the
orchestrator uses on a server (``GET /health``, ``POST /v1/completions`` with ``n`` choices of token
ids and logprobs, ``POST /v1/chat/completions`` with one turn's token ids and logprobs, ``/pause``, ``/resume``, ``/reset_prefix_cache``, ``/collective_rpc`` with
``reload_weights``). A completion takes DELAY seconds, so a test can kill the process while requests
are in flight. Every request is appended to LOG as one JSON line (``route``, the ``weights`` the server
had loaded when it answered, ``port``), written before the answer, so a test reads what the server
saw, in order, even after it was killed.

    python tests/support/rollout_double.py PORT LOG [DELAY]
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from json_reply import send_json

STATE = {"weights": None}
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def note(self, route: str, **more) -> None:
        line = json.dumps({"route": route, "weights": STATE["weights"], "port": self.server.server_port, **more})
        with LOCK, open(self.server.log, "a") as f:  # type: ignore[attr-defined]
            f.write(line + "\n")

    def do_GET(self):  # noqa: N802
        send_json(self, 200, {})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
        path = self.path.split("?")[0]
        if path == "/collective_rpc" and body.get("method") == "reload_weights":
            STATE["weights"] = body["kwargs"]["weights_path"]
        if path == "/v1/completions":
            self.note(path, session=self.headers.get("X-Session-ID"))
            time.sleep(self.server.delay)  # type: ignore[attr-defined]
            n = body.get("n", 1)
            choice = {"text": "ab", "logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-0.5, -0.25]}}
            send_json(self, 200, {"choices": [dict(choice, index=i) for i in range(n)]})
            return
        if path == "/v1/chat/completions":
            self.note(path, session=self.headers.get("X-Session-ID"))
            time.sleep(self.server.delay)  # type: ignore[attr-defined]
            sent = (body.get("kv_transfer_params") or {}).get("prompt_token_ids") or [1, 2, 3]
            turn = {"message": {"role": "assistant", "content": "50"}, "token_ids": [5, 6], "finish_reason": "stop",
                    "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -0.25}]}}
            send_json(self, 200, {"prompt_token_ids": sent, "choices": [turn]})
            return
        self.note(path)
        send_json(self, 200, {})


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    server.log = sys.argv[2]  # type: ignore[attr-defined]
    server.delay = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0  # type: ignore[attr-defined]
    server.serve_forever()
