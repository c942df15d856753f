"""vllm-router in P/D mode passes the job's secret on to the prefill and decode servers.

vllm-router 0.1.17 does not forward the client's Authorization header in P/D mode; it sends
``Bearer $OPENAI_API_KEY``. slurmrl.runtime.gates.router_key runs it with RUN_DIR/secret there, never
on a command line. The servers here are a test double that records the header it gets (the real
vLLM servers' check is tested in test_inference_vllm.py and, through the router, on the local
Slurm in test_multinode_worker.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

from live_components import free_port_base

RECORDER = textwrap.dedent("""
    import json, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    class H(BaseHTTPRequestHandler):
        def reply(self):
            body = json.dumps({"id": "x", "object": "text_completion", "model": "tiny", "choices": [
                {"index": 0, "text": "hi", "finish_reason": "length"}], "kv_transfer_params": {},
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def do_GET(self):
            self.reply()
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with open(sys.argv[2], "a") as f:
                f.write(json.dumps([self.path, self.headers.get("Authorization")]) + "\\n")
            self.reply()
        def log_message(self, *a):
            pass
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(port)


def test_pd_router_sends_the_job_secret_to_both_pools(tmp_path):
    (tmp_path / "secret").write_text("the-job-secret\n")
    base = free_port_base()
    router, metrics, prefill, decode = base, base + 1, base + 2, base + 3
    procs = []
    try:
        for port in (prefill, decode):
            procs.append(subprocess.Popen([sys.executable, "-c", RECORDER, str(port), str(tmp_path / f"{port}.log")]))
        env = {**os.environ, "SLURMRL_SECRET_FILE": str(tmp_path / "secret")}
        env.pop("OPENAI_API_KEY", None)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "slurmrl.runtime.gates.router_key", "--host", "127.0.0.1", "--port", str(router),
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics), "--vllm-pd-disaggregation",
             "--prefill", f"http://127.0.0.1:{prefill}", "--decode", f"http://127.0.0.1:{decode}",
             "--policy", "round_robin", "--kv-connector", "nixl"],
            env=env, stdout=open(tmp_path / "router.log", "wb"), stderr=subprocess.STDOUT))
        wait_port(router)
        argv = Path(f"/proc/{procs[-1].pid}/cmdline").read_bytes()
        assert b"the-job-secret" not in argv
        req = urllib.request.Request(
            f"http://127.0.0.1:{router}/v1/completions", method="POST",
            data=json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 1}).encode(),
            headers={"Content-Type": "application/json", "Authorization": "Bearer the-job-secret"})
        deadline = time.monotonic() + 60
        while True:  # the router takes the workers in once their health checks pass
            try:
                urllib.request.urlopen(req, timeout=30).read()
                break
            except urllib.error.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        for port in (prefill, decode):
            seen = [json.loads(line) for line in (tmp_path / f"{port}.log").read_text().splitlines()]
            assert ["/v1/completions", "Bearer the-job-secret"] in seen, (port, seen)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
