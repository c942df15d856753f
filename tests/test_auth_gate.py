"""The gate in front of vllm-router: the router's management routes, which vllm-router leaves
open, need the job's secret like everything else; /health and /metrics stay open; responses
stream through as they come; the gate ends with the router. The router here is a test double
(an HTTP server that records what reaches it and streams server-sent events slowly); the real
router behind the gate serves the Slurm tests (test_inference_cluster.py and others)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request

import pytest
from live_components import free_port_base

DOUBLE = textwrap.dedent("""
    import json, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def answer(self):
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            if self.path.startswith("/stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i in range(3):
                    data = f"data: {i}\\n\\n".encode()
                    self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(data), data))
                    self.wfile.flush()
                    time.sleep(1.5)
                self.wfile.write(b"0\\r\\n\\r\\n")
                return
            out = json.dumps({"path": self.path, "method": self.command, "body": body.decode(),
                              "auth": self.headers.get("Authorization")}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
        do_GET = do_POST = do_DELETE = answer
        def log_message(self, *a):
            pass
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")
SECRET = "gate-test-secret"
AUTH = {"Authorization": f"Bearer {SECRET}"}


def call(url: str, method: str = "GET", body: bytes | None = None, headers: dict | None = None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.read()


@pytest.fixture
def gate(tmp_path):
    (tmp_path / "secret").write_text(SECRET + "\n")
    base = free_port_base()
    listen, upstream = base, base + 1
    env = {**os.environ, "SLURMRL_SECRET_FILE": str(tmp_path / "secret")}
    p = subprocess.Popen([sys.executable, "-m", "slurmrl.runtime.gates.auth_gate", "--listen", f"127.0.0.1:{listen}",
                          "--upstream", str(upstream), "--", sys.executable, "-c", DOUBLE, str(upstream)], env=env)
    deadline = time.monotonic() + 60
    while True:
        try:
            call(f"http://127.0.0.1:{listen}/health")
            break
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < deadline and p.poll() is None, "the gate did not come up"
            time.sleep(0.3)
    yield p, f"http://127.0.0.1:{listen}"
    if p.poll() is None:
        p.terminate()
        p.wait(30)


def test_management_routes_need_the_secret_and_requests_pass_unchanged(gate):
    p, url = gate
    for path, method in (("/add_worker?url=http://evil:1", "POST"), ("/remove_worker?url=x", "POST"),
                         ("/flush_cache", "POST"), ("/v1/completions", "POST"), ("/list_workers", "GET")):
        with pytest.raises(urllib.error.HTTPError, match="401"):
            call(url + path, method, b"{}" if method == "POST" else None)
        with pytest.raises(urllib.error.HTTPError, match="401"):
            call(url + path, method, b"{}" if method == "POST" else None, {"Authorization": "Bearer wrong"})
    status, body = call(url + "/v1/completions?x=1", "POST", b'{"prompt": "hi"}',
                        {**AUTH, "Content-Type": "application/json"})
    got = json.loads(body)
    assert status == 200 and got == {"path": "/v1/completions?x=1", "method": "POST", "body": '{"prompt": "hi"}',
                                     "auth": f"Bearer {SECRET}"}
    for open_path in ("/health", "/metrics"):
        assert call(url + open_path)[0] == 200


def test_streams_pass_as_they_come(gate):
    _, url = gate
    req = urllib.request.Request(url + "/stream", headers=AUTH)
    start = time.monotonic()
    with urllib.request.urlopen(req, timeout=30) as r:
        first = r.readline()
        first_at = time.monotonic() - start
        rest = r.read()
    assert first == b"data: 0\n" and first_at < 1.4, first_at  # not held back until the 4.5 s stream ends
    assert b"data: 2" in rest


def test_the_gate_ends_with_the_router_and_ends_it_on_term(gate, tmp_path):
    p, url = gate
    kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
    assert len(kids) == 1
    os.kill(int(kids[0]), signal.SIGKILL)  # the router dies: the gate must not keep answering 502s
    assert p.wait(30) == 128 + signal.SIGKILL


def test_term_stops_the_router_too(gate):
    p, url = gate
    kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 128 + signal.SIGTERM
    time.sleep(0.5)
    assert not os.path.exists(f"/proc/{kids[0]}") or "zombie" in open(f"/proc/{kids[0]}/status").read().lower()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", int(url.rsplit(":", 1)[1]))) != 0
