"""Test double for a broken vLLM server: GET (``/health`` too) answers 200, but every completion
fails. Used to show that a job whose servers pass /health but cannot serve never becomes ready.

    python tests/support/no_tokens_server.py PORT [HOST] [--zero-tokens]

By default POST answers 500 with a short reason; with ``--zero-tokens`` it answers 200 with a
completion of no tokens (``usage.completion_tokens`` 0), as a server whose KV transfers fail does.
"""

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from json_reply import send_json

ZERO = "--zero-tokens" in sys.argv


class Broken(BaseHTTPRequestHandler):
    _send = send_json

    def do_GET(self):  # noqa: N802
        if self.path.startswith("/v1/models"):
            self._send(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})
        else:
            self._send(200, {"port": self.server.server_port})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if ZERO:
            self._send(200, {"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 0, "total_tokens": 1}})
        else:
            self._send(500, {"error": {"message": "engine dead (test double)", "code": 500}})

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    host = sys.argv[2] if len(sys.argv) > 2 and not sys.argv[2].startswith("-") else "0.0.0.0"  # a script edit may leave vLLM flags after the port
    ThreadingHTTPServer((host, int(sys.argv[1])), Broken).serve_forever()
