"""Restart in place on the local Slurm cluster with real vLLM, vllm-router and vLLM's load generator
(issue 41).

recipes/inference-debug.toml with both servers on one node (`inference.gpus_per_node = 2`: one srun
step, two tasks), `max_restarts = 1` and a [benchmark] through the router (one point, then = "serve").
One job shows, in order:
1. while the benchmark runs, SIGKILL of one server's vLLM engine restarts that server in place (same node,
   same port, a new pid, ready again; status: 1 restart; events.jsonl: died + restarted; lock.toml says
   so) while the job runs on; the router sends to the restarted server again (its own /metrics counter
   rises); the benchmark completes every point, and no request failed beyond those in flight at the kill
   (counted from the benchmark's own per-request times against the kill's moment on the same clock),
   each failed one sent before the kill; status shows the benchmark's table;
2. killed again with no restart left, the task ends and is recorded dead, and the job still serves
   through the router on the other.
"""

from __future__ import annotations

import json
import re
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
from cluster_jobs import kill_engine, node_address, server_pid, status, wait
from live_components import post_json

from slurmrl import secret
from slurmrl.contract import events
from slurmrl.ports import base_for_job
from slurmrl.rundir import ended
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import read_ready
from slurmrl.runtime.fixtures.tiny_model import build as build_tiny

pytestmark = [pytest.mark.cluster, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parent.parent


def served(base: str) -> float:
    """Requests the vLLM server at ``base`` (http://ADDRESS:PORT) has finished, from its /metrics."""
    text = urllib.request.urlopen(f"{base}/metrics", timeout=30).read().decode()
    return sum(float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)", text, re.M))


def in_flight_at(requests: list[list], moment: float) -> int:
    """Requests of a benchmark point ([start, latency, ok] each) begun by ``moment`` and not finished by it
    (a failed one has no end: it counts when it began before)."""
    return sum(1 for start, latency, ok in requests if start <= moment and (not ok or start + latency >= moment))


def bench_summary(run_dir: Path) -> dict | None:
    try:
        return json.loads(RunDir(run_dir).benchmark_summary().read_text())
    except (OSError, ValueError):  # not written yet, or being written
        return None


def of_task(run_dir: Path, task: int) -> list[events.Event]:
    return [e for e in events.read(RunDir(run_dir).events) if e.component == "inference" and e.task == task]


def test_a_killed_engine_is_restarted_in_place_under_load_then_dead_and_the_job_serves_on(slurm_cluster, tmp_path):
    model = build_tiny(tmp_path / "tiny")
    r = slurm_cluster.slurmrl(
        "render", str(ROOT / "recipes" / "inference-debug.toml"),
        "--set", f'model.path="{model}"', "--set", f'python.executable="{sys.executable}"',
        "--set", "slurm.grace_seconds=5", "--set", "model.max_model_len=128",
        "--set", "inference.nodes=1", "--set", "inference.gpus_per_node=2",
        "--set", "inference.max_restarts=1", "--set", "inference.restart_backoff_s=1",
        "--set", "benchmark.concurrencies=[2]", "--set", "benchmark.input_lens=[16]",
        "--set", "benchmark.output_lens=[8]", "--set", "benchmark.num_prompts=600",
        "--set", 'benchmark.then="serve"', "--set", "benchmark.timeout=900",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "inference-debug"
    assert "--restart on-failure --max-restarts 1 --restart-backoff 1" in (run_dir / "job.sbatch").read_text()
    r = slurm_cluster.slurmrl("submit", str(run_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = str(json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"])
    try:
        wait(lambda: RunDir(run_dir).ready_file(0, "router", 0).exists() and server_pid(run_dir, 1),
             "both servers and the router", 900, run_dir)
        auth = secret.headers(run_dir / secret.FILE)
        router_url, _, _ = read_ready(RunDir(run_dir).ready_file(0, "router", 0))
        router = f"http://{node_address(slurm_cluster, router_url.removeprefix('http://').split(':')[0])}:" \
                 f"{base_for_job(int(job_id))}"
        body = {"model": str(model), "prompt": "hello", "max_tokens": 4, "ignore_eos": True}
        url, _, first = read_ready(RunDir(run_dir).ready_file(0, "inference", 1))
        assert first is not None
        host, port = url.removeprefix("http://").split(":")
        direct = f"http://{node_address(slurm_cluster, host)}:{port}"

        # 1. the engine dies under the benchmark's load: the server is restarted in place (same URL, a new pid)
        wait(lambda: (bench_summary(run_dir) or {}).get("status") == "running" and served(direct) >= 5,
             "the benchmark's requests reaching inference.1", 300, run_dir)
        killed_at = time.perf_counter()  # CLOCK_MONOTONIC: the benchmark's request times are on the same clock
        killed_wall = time.time()  # the events' clock
        killed = kill_engine(first)
        second = wait(lambda: server_pid(run_dir, 1, not_pid=first), f"inference.1 ready again after kill of {killed}",
                      900, run_dir)
        assert read_ready(RunDir(run_dir).ready_file(0, "inference", 1))[0] == url  # same node, same port
        assert [e.kind for e in of_task(run_dir, 1)] == ["died", "restarted"]
        died = of_task(run_dir, 1)[0]
        assert died.cause and died.job_id == job_id and died.attempt == 0 and died.node == url.split("//")[1].split(":")[0]
        st = status(slurm_cluster, run_dir, tmp_path)
        assert st["state"] == "RUNNING", st
        inference = {c["name"]: c for c in st["components"]}["inference"]
        assert inference["restarts"] == 1 and inference["dead"] == [], inference
        assert [e["kind"] for e in st["events"]] == ["died", "restarted"]
        text = slurm_cluster.slurmrl("status", str(run_dir), cwd=tmp_path).stdout
        assert "restarts" in text and "restarted: inference.1 on " in text, text
        lock = tomllib.loads((run_dir / "lock.toml").read_text())
        assert [(x["kind"], x["task"]) for x in lock["lock"]["restarts"]] == [("restarted", 1)]
        assert post_json(f"{router}/v1/completions", body, auth, timeout=120)["usage"]["completion_tokens"] == 4

        # the router sends to the restarted server again: its own counter (a new process: from 0) rises
        def readmitted() -> bool:
            post_json(f"{router}/v1/completions", body, auth, timeout=120)
            return served(direct) > 0
        wait(readmitted, "the router to send to the restarted inference.1", 120, run_dir)

        # the benchmark completed its point: every request but those in flight at the kill succeeded
        summary = wait(lambda: (s := bench_summary(run_dir)) and s["status"] != "running" and s, "the benchmark", 900,
                       run_dir)
        assert summary["status"] == "done" and summary["error"] is None, summary
        assert summary["target"] == router_url  # through the router
        point = summary["points"][0]
        requests = json.loads((RunDir(run_dir).benchmark_dir() / point["file"]).read_text())["requests"]
        in_flight = in_flight_at(requests, killed_at)
        failed = [r for r in requests if not r[2]]
        # vLLM's API server takes requests until it has seen its EngineCore die, and it exits on the first
        # one that fails: a request sent in that window is lost too. Once the server is gone (the supervisor
        # records the death after that), the router sends elsewhere: nothing begun after the record failed.
        died_after = died.time - killed_wall
        print(f"kill of {killed}: {in_flight} request(s) in flight, {len(failed)} failed, {point['completed']} "
              f"completed of {len(requests)}; the death recorded {died_after:.2f} s after the kill")
        assert len(requests) == 600 and point["completed"] + point["failed"] == 600, point
        assert len(failed) == point["failed"] <= 2, (point, in_flight)  # at most the concurrency: one death
        assert all(start - killed_at <= died_after for start, _, _ in failed), (failed, killed_at, died_after)
        assert point.get("failed_with_deaths", 0) == point["failed"], point
        assert point["output_throughput"] > 0 and point["ttft_p50_ms"] > 0, point
        assert RunDir(run_dir).benchmark_plot().stat().st_size > 0
        text = slurm_cluster.slurmrl("status", str(run_dir), cwd=tmp_path).stdout
        assert "benchmark: done, 1/1 point(s)" in text and "TTFT p50/p99" in text, text
        phases = [p["what"] for p in status(slurm_cluster, run_dir, tmp_path)["phases"]]
        assert any(w.startswith("benchmark done: 1 point(s)") for w in phases), phases

        # 2. no restart left: the task ends, recorded dead; the other server serves on, the job runs
        kill_engine(second)
        wait(lambda: [e.kind for e in of_task(run_dir, 1)][-1:] == ["dead"], "inference.1 recorded dead", 300, run_dir)
        rec = wait(lambda: ended.read_ended(RunDir(run_dir).ended_file(0, "inference", 1)), "its end record", 60, run_dir)
        assert rec.failed
        time.sleep(5)  # long enough for the script to have torn the job down, were it going to
        st = status(slurm_cluster, run_dir, tmp_path)
        assert st["state"] == "RUNNING" and not st["failed"], st
        inference = {c["name"]: c for c in st["components"]}["inference"]
        assert [d["task"] for d in inference["dead"]] == [1] and inference["ready"] == [0], inference
        answered = [post_json(f"{router}/v1/completions", body, auth, timeout=120) for _ in range(4)]
        assert all(a["usage"]["completion_tokens"] == 4 for a in answered)
        assert [e.kind for e in of_task(run_dir, 0)] == []  # the other server never died
    finally:
        c = slurm_cluster.slurmrl("cancel", str(run_dir), cwd=tmp_path, timeout=180)
    assert c.returncode == 0, c.stdout + c.stderr
    left = slurm_cluster.wait_no_job_processes(job_id)
    assert not left, "left after cancel:\n" + "\n".join(left)
