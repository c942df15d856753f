"""Prometheus ``/metrics`` of our own programs (trainer rank 0, orchestrator), for the [collector].

Each number of the latest step's record (``Metrics.log``) is a gauge ``slurmrl_<role>_<field>``:
the step's time split (the orchestrator's ``generate_s``, ``wait_s``, ``reload_s``, ``score_s``; the
trainer's ``step_time_s``, ``wait_s``, ``publish_s``), ``tokens_per_s``, reward, loss, ...; and
``slurmrl_<role>_steps_total`` counts the records. Served on ``0.0.0.0:$SLURMRL_METRICS_PORT`` (the
planner sets it from the port table when the recipe has a [collector]; nothing is served without it)
by prometheus-client where it is installed, else by a few lines of our own with the same text. The URL
goes to ``RUN_DIR/metrics/endpoints/attempt-N/<role>``, where the collector finds it.
"""

from __future__ import annotations

import math
import os
import re
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from slurmrl.contract import job_env
from slurmrl.rundir.paths import RunDir

try:  # optional: the same names and text either way
    import prometheus_client as _client
except ImportError:  # pragma: no cover - installed with vLLM
    _client = None  # type: ignore[assignment]

ENV = job_env.METRICS_PORT
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def metric_name(role: str, key: str) -> str:
    return "slurmrl_" + re.sub(r"[^a-zA-Z0-9_]", "_", f"{role}_{key}")


def numbers(record: dict) -> dict[str, float]:
    """The record's finite numbers (booleans and the step's wall-clock ``time`` left out)."""
    out = {}
    for k, v in record.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or k == "time":
            continue
        if math.isfinite(float(v)):
            out[k] = float(v)
    return out


class Exposition:
    """The gauges of one role; ``text()`` is the exposition our own server answers with."""

    def __init__(self, role: str, use_client: bool = True):
        self.role, self.steps, self.lock = role, 0, threading.Lock()
        self.values: dict[str, float] = {}
        self.client = _client if use_client else None
        self.gauges: dict = {}
        if self.client is not None:
            self.registry = self.client.CollectorRegistry()
            self.counter = self.client.Counter(metric_name(role, "steps"), "step records", registry=self.registry)

    def update(self, record: dict) -> None:
        with self.lock:
            self.steps += 1
            for k, v in numbers(record).items():
                self.values[k] = v
                if self.client is not None:
                    g = self.gauges.get(k)
                    if g is None:
                        g = self.gauges[k] = self.client.Gauge(metric_name(self.role, k), f"latest step's {k}",
                                                               registry=self.registry)
                    g.set(v)
            if self.client is not None:
                self.counter.inc()

    def text(self) -> str:
        if self.client is not None:
            return self.client.generate_latest(self.registry).decode()
        with self.lock:
            total = metric_name(self.role, "steps_total")
            lines = [f"# TYPE {total} counter", f"{total} {self.steps}"]
            for k, v in sorted(self.values.items()):
                name = metric_name(self.role, k)
                lines += [f"# TYPE {name} gauge", f"{name} {v!r}"]
        return "\n".join(lines) + "\n"


def _handler(exp: Exposition):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = exp.text().encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # no line per scrape in the program's log
            pass

    return Handler


class Server(ThreadingHTTPServer):
    """A scraper that gives up (the collector's timeout) and closes its end is no error: nothing is
    printed for it; anything else is printed as http.server does."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)):
            return
        super().handle_error(request, client_address)


def serve(role: str, port: int, host: str = "0.0.0.0", use_client: bool = True) -> tuple[Exposition, ThreadingHTTPServer]:
    exp = Exposition(role, use_client)
    server = Server((host, port), _handler(exp))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=f"{role}-metrics", daemon=True).start()
    return exp, server


def from_env(role: str, log, env=None) -> Exposition | None:
    """Serve ``role``'s /metrics when ``$SLURMRL_METRICS_PORT`` says where, and register the URL;
    None (nothing served) without it, or when the port cannot be taken (said in the log)."""
    env = os.environ if env is None else env
    port = env.get(ENV, "")
    if not port.isdigit():
        return None
    try:
        exp, _ = serve(role, int(port))
    except OSError as e:
        log(f"/metrics not served on port {port}: {e}")
        return None
    if job_env.in_job(env):
        run_dir = RunDir.from_env(env)
        path = run_dir.metrics_endpoint(RunDir.attempt_from_env(env), role)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(f"http://{socket.gethostname()}:{port}/metrics\n")
        tmp.replace(path)
    log(f"/metrics on port {port}")
    return exp
