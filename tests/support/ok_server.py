"""Test double for a vLLM server: answers 200 with its own port on every GET (``/health`` too)
and every POST (a request a router passes on), shaped as a completion of one token, so the
job's ready check (one completion through the front, slurmrl.runtime.steps.ready_check) passes. Used where a test checks the script's mechanics
(tasks, ports, readiness, routing), not the engine. The answer's ``received`` is the JSON body it was sent
(what a router passed on).

    python tests/support/ok_server.py PORT [HOST]     (HOST: the address to listen on, default all)
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from json_reply import send_json


class Ok(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        send_json(self, 200, {"port": self.server.server_port})

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            received = json.loads(body)
        except ValueError:
            received = None
        send_json(self, 200, {"port": self.server.server_port, "choices": [{"index": 0, "text": "ok"}],
                              "usage": {"completion_tokens": 1}, "received": received})

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    host = sys.argv[2] if len(sys.argv) > 2 and not sys.argv[2].startswith("-") else "0.0.0.0"  # a script edit may leave vLLM flags after the port
    ThreadingHTTPServer((host, int(sys.argv[1])), Ok).serve_forever()
