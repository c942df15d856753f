"""The [collector] against real local HTTP servers: Prometheus text in, the compact append-only
files of RUN_DIR/metrics/scrape/ out (only changed values; the secret where the endpoint needs it;
failures noted once; the size cap), read back by slurmrl.rundir.scrape; the trainer's and
orchestrator's own /metrics (prometheus-client and our own text) found through their registration."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from supervised_processes import free_port

from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import write_ready
from slurmrl.rundir.scrape import parse_exposition, read_scrapes, split_key
from slurmrl.runtime import exposition
from slurmrl.runtime.collector import gpus
from slurmrl.runtime.collector.loop import Collector

ROOT = Path(__file__).resolve().parent.parent
SECRET = "s3cret"


class Prometheus:
    """A real HTTP server answering GET /metrics with a counter that grows per request and a constant
    gauge; with ``secret`` it answers 401 without ``Authorization: Bearer <secret>``."""

    def __init__(self, secret: str | None = None):
        self.hits = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if secret and self.headers.get("Authorization") != f"Bearer {secret}":
                    self.send_error(401)
                    return
                outer.hits += 1
                body = ("# HELP vllm:request_success_total done\n# TYPE vllm:request_success_total counter\n"
                        f'vllm:request_success_total{{model_name="m",finished_reason="stop"}} {outer.hits}.0\n'
                        'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
                        'vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m, \\"x\\""} 3.0\n'
                        "weird_nan NaN\n").encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def prom():
    p = Prometheus(secret=SECRET)
    yield p
    p.close()


def test_parse_exposition_keeps_labels_with_spaces_quotes_and_special_values():
    text = ('# TYPE a counter\na_total{x="1 2",y="q\\"}"} 5\nb 1.5 1700000000\nc{le="+Inf"} +Inf\n'
            "broken{x=\"1\" 3\nnot_a_number abc\n")
    got = parse_exposition(text)
    assert got['a_total{x="1 2",y="q\\"}"}'] == 5.0 and got["b"] == 1.5 and got['c{le="+Inf"}'] == float("inf")
    assert "not_a_number" not in got and len(got) == 3
    assert split_key('a_total{x="1 2",y="q\\"}"}') == ("a_total", {"x": "1 2", "y": 'q"}'})


def test_the_collector_keeps_only_what_changed_and_reads_back_every_scrape(tmp_path, prom):
    run = RunDir(tmp_path)
    write_ready(run.ready_file(0, "inference", 0), prom.url, 1)
    c = Collector(run, "0", ["inference"], {}, max_bytes=1 << 20, timeout=5, headers={"Authorization": f"Bearer {SECRET}"},
                  gpu=False)
    for t in (100.0, 110.0, 120.0):
        c.tick(t)
    path = run.scrape_file(0, "inference.0")
    lines = [json.loads(x, parse_constant=float) for x in path.read_text().splitlines()]
    assert lines[0] == {"start": 100.0, "url": prom.url + "/metrics"}
    assert len(lines[1]["k"]) == 4 and len(lines[1]["v"]) == 4  # every key and value, once
    assert "k" not in lines[2] and list(lines[2]["v"].values()) == [2.0]  # only the counter changed
    s = read_scrapes(path)
    key = 'vllm:request_success_total{model_name="m",finished_reason="stop"}'
    assert s.times == [100.0, 110.0, 120.0] and s.series(key) == [(100.0, 1.0), (110.0, 2.0), (120.0, 3.0)]
    assert s.series('vllm:kv_cache_usage_perc{model_name="m"}') == [(t, 0.25) for t in (100.0, 110.0, 120.0)]
    assert s.series("weird_nan") == [] and s.keys("vllm:time_to_first_token_seconds_bucket")
    # a restart of the collector (a new attempt's or the same file's) starts its key table over
    c2 = Collector(run, "0", ["inference"], {}, max_bytes=1 << 20, timeout=5, headers={"Authorization": f"Bearer {SECRET}"},
                   gpu=False)
    c2.tick(130.0)
    with path.open("a") as f:
        f.write('{"t": 140, "v": {"0": 9')  # a last line cut short by a kill
    assert read_scrapes(path).series(key)[-1] == (130.0, 4.0)


def test_without_the_secret_the_failure_is_noted_once_and_the_collector_goes_on(tmp_path, prom):
    run = RunDir(tmp_path)
    c = Collector(run, "0", [], {"router": prom.url + "/metrics", "gone": "http://127.0.0.1:9/metrics"},
                  max_bytes=1 << 20, timeout=2, headers={}, gpu=False)
    c.tick(1.0)
    c.tick(2.0)
    s = read_scrapes(run.scrape_file(0, "router"))
    assert [e for _, e in s.errors] == ["HTTP 401"] and s.times == []
    assert len(read_scrapes(run.scrape_file(0, "gone")).errors) == 1


def test_the_size_cap_stops_writing_and_says_so(tmp_path, prom):
    run = RunDir(tmp_path)
    c = Collector(run, "0", [], {"x": prom.url + "/metrics"}, max_bytes=400, timeout=5,
                  headers={"Authorization": f"Bearer {SECRET}"}, gpu=False)
    for t in range(10):
        c.tick(float(t))
    s = read_scrapes(run.scrape_file(0, "x"))
    assert s.full and len(s.times) < 10
    size = run.scrape_file(0, "x").stat().st_size
    c.tick(99.0)
    assert run.scrape_file(0, "x").stat().st_size == size


@pytest.mark.parametrize("use_client", [True, False])
def test_our_programs_serve_their_step_as_prometheus_text(use_client):
    exp, server = exposition.serve("orchestrator", 0, host="127.0.0.1", use_client=use_client)
    try:
        exp.update({"step": 3, "generate_s": 1.5, "wait_s": 0.25, "tokens_per_s": 80.0, "hybrid": True,
                    "time": 1e9, "reward_mean": float("nan")})
        port = server.server_address[1]
        got = parse_exposition(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())
    finally:
        server.shutdown()
    assert got["slurmrl_orchestrator_generate_s"] == 1.5 and got["slurmrl_orchestrator_tokens_per_s"] == 80.0
    assert got["slurmrl_orchestrator_steps_total"] == 1.0 and got["slurmrl_orchestrator_step"] == 3.0
    assert "slurmrl_orchestrator_time" not in got and "slurmrl_orchestrator_hybrid" not in got
    assert "slurmrl_orchestrator_reward_mean" not in got


def test_a_registered_program_is_scraped_and_nothing_is_served_without_the_port(tmp_path):
    assert exposition.from_env("trainer", print, env={}) is None
    env = {"SLURMRL_METRICS_PORT": str(free_port()), "SLURMRL_RUN_DIR": str(tmp_path), "SLURMRL_ATTEMPT": "1"}
    exp = exposition.from_env("trainer", print, env=env)
    assert exp is not None
    exp.update({"step": 1, "step_time_s": 2.0, "publish_s": 0.5})
    run = RunDir(tmp_path)
    assert run.metrics_endpoint(1, "trainer").read_text().startswith("http://")
    c = Collector(run, "1", [], {}, max_bytes=1 << 20, timeout=5, headers={}, gpu=False)
    c.tick(5.0)
    assert read_scrapes(run.scrape_file(1, "trainer")).series("slurmrl_trainer_step_time_s") == [(5.0, 2.0)]


def test_nvidia_smi_lines_become_gpu_samples():
    got = gpus.parse("0, 87, 40123, 81559\n1, [N/A], 12, 81559\nNo devices were found\n")
    assert got == {'gpu_utilization_percent{gpu="0"}': 87.0, 'gpu_memory_used_mib{gpu="0"}': 40123.0,
                   'gpu_memory_total_mib{gpu="0"}': 81559.0, 'gpu_memory_used_mib{gpu="1"}': 12.0,
                   'gpu_memory_total_mib{gpu="1"}': 81559.0}


def test_the_program_scrapes_until_term_with_the_job_secret(tmp_path, prom):
    run = RunDir(tmp_path)
    (tmp_path / "secret").write_text(SECRET)
    write_ready(run.ready_file(0, "inference", 1), prom.url, 1)
    env = {**os.environ, "SLURMRL_RUN_DIR": str(tmp_path), "SLURMRL_ATTEMPT": "0",
           "SLURMRL_SECRET_FILE": str(tmp_path / "secret"), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    p = subprocess.Popen([sys.executable, "-m", "slurmrl.runtime.collector", "--interval", "0.2", "--ready", "inference"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(read_scrapes(run.scrape_file(0, "inference.1")).times) < 2:
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=30)
    assert p.returncode == 0, out
    assert "scraping inference.1 at " in out and "stopped;" in out
    assert not read_scrapes(run.scrape_file(0, "inference.1")).errors
