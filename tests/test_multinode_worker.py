"""A prefill/decode job whose decode worker is ONE vLLM deployment spanning two nodes, on the local
Slurm cluster with real vLLM (CPU build) and vllm-router.

recipes/inference-pd.toml shrunk to the local cluster: prefill one server on n1; decode tp=1 x
dp=2 on nodes of one GPU, so one worker spans two nodes: data-parallel rank 0 and the API on its
first node, rank 1 headless on the second (`--headless --data-parallel-start-rank 1`), both
engines in one deployment behind the leader's API. This machine has no NIXL, so the user's hand
edit removes the KV-transfer flag from the script (the script is theirs to edit); everything else
is as rendered. Checked: all servers start, the follower is headless and serves no API, requests
through the router are answered by both of the decode worker's engines. Then the follower's process
is SIGKILLed: the worker restarts as a whole (the leader's tasks ended too, both relaunched on the same
nodes and ports, new pids, ready again), events and status say so once, and both engines answer
through the router again. Cancel leaves nothing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cluster_jobs import node_address
from live_components import post_json

from slurmrl import secret
from slurmrl.contract import events
from slurmrl.ports import base_for_job
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import read_ready
from slurmrl.rundir.scrape import read_scrapes
from slurmrl.runtime.fixtures.tiny_model import build as build_tiny

pytestmark = [pytest.mark.cluster, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parent.parent


def engine_requests(metrics: str) -> dict[str, float]:
    """Finished requests per data-parallel engine, from vLLM's Prometheus text."""
    out: dict[str, float] = {}
    for labels, value in re.findall(r"^vllm:request_success_total\{([^}]*)\} (\S+)", metrics, re.M):
        engine = re.search(r'engine="(\d+)"', labels)
        key = engine.group(1) if engine else "0"
        out[key] = out.get(key, 0) + float(value)
    return out


def bench_status(summary: Path) -> str | None:
    try:
        return json.loads(summary.read_text()).get("status")
    except (OSError, ValueError):  # not written yet, or being written
        return None


def wait_for_scrapes(run_dir: Path, want: set[str], served: int, seconds: float = 90) -> dict[str, float]:
    """The collector's scrape files of ``want`` once each has counted ``served`` finished requests."""
    run, got = RunDir(run_dir), {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = {}
        for f in run.scrape_files(0):
            if f.name in want:
                scrapes = read_scrapes(f)
                got[f.name] = sum(pts[-1][1] for k in scrapes.keys("vllm:request_success_total")
                                  if (pts := scrapes.series(k)))
        if set(got) == want and all(v >= served for v in got.values()):
            return got
        time.sleep(2)
    return {}


def test_pd_decode_worker_spans_two_nodes_and_serves(slurm_cluster, tmp_path):
    model = build_tiny(tmp_path / "tiny")
    sets = {
        "model.path": f'"{model}"', "model.served_name": '"tiny"', "model.dtype": '"float32"',
        "model.max_model_len": "128", "python.executable": f'"{sys.executable}"',
        "slurm.partition": '"debug"', "slurm.gpus_per_node": "1", "slurm.cpus_per_node": "8",
        "slurm.time": '"00:20:00"', "slurm.grace_seconds": "5", "slurm.exclusive": "false",
        "inference.enforce_eager": "true", "inference.startup_timeout": "900",
        "inference.env": '{VLLM_CPU_KVCACHE_SPACE="1"}', "inference.restart_backoff_s": "1",
        "inference.prefill": "{replicas=1, tp=1}",
        "inference.decode": "{replicas=1, tp=1, dp=2}",
        "inference.router.policy": '"round_robin"',
        "collector.interval": "2",  # [collector]: what the P/D job served is kept and reported after it
        # a small [benchmark] through the router, then the job serves on for the checks below
        "benchmark.concurrencies": "[1, 2]", "benchmark.input_lens": "[16]", "benchmark.output_lens": "[8]",
        "benchmark.num_prompts": "4", "benchmark.then": '"serve"', "benchmark.timeout": "600",
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    plan = slurm_cluster.slurmrl("plan", str(ROOT / "recipes" / "inference-pd.toml"), *args, cwd=tmp_path)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert re.search(r"decode +1 +0-1 +1 +1 .*\(first node\)", plan.stdout), plan.stdout
    r = slurm_cluster.slurmrl("render", str(ROOT / "recipes" / "inference-pd.toml"), *args, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "inference-pd"
    script = run_dir / "job.sbatch"
    text = script.read_text()
    decode = text[text.index("task_decode() {"):text.index("export -f task_decode")]
    assert "slurmrl.runtime.vllm.cli serve" in decode  # vLLM's CLI: the only entry that honours --headless
    for flag in ("--data-parallel-size 2", "--data-parallel-size-local 1", '--data-parallel-address "${leader}"'):
        assert flag in decode
    # the hand edit: no NIXL here, so no KV-transfer connector (one line per role)
    edited = re.sub(r" \\\n        --kv-transfer-config '[^']*'", "", text)
    assert edited.count("--kv-transfer-config") == 0 and text.count("--kv-transfer-config") == 2
    script.write_text(edited)
    r = slurm_cluster.slurmrl("submit", str(run_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]
    ready_dir = run_dir / "ready" / "attempt-0"
    want = {"prefill.0", "decode.0", "decode.1", "router.0"}
    try:
        deadline = time.monotonic() + 900
        have: set[str] = set()
        while time.monotonic() < deadline:
            have = {f.name for f in ready_dir.glob("*")} if ready_dir.exists() else set()
            if want <= have:
                break
            failed = run_dir / "logs" / "attempt-0" / "FAILED"
            assert not failed.exists(), failed.read_text()
            time.sleep(3)
        assert want <= have, f"not ready: {have}"
        # the follower serves no API: its ready file has no URL; the leader's does
        lead_url, ntasks, _ = read_ready(ready_dir / "decode.0")
        follow_url, _, follow_pid = read_ready(ready_dir / "decode.1")
        assert ntasks == 2 and lead_url.startswith("http://") and follow_url in ("-", "", None)
        argv = Path(f"/proc/{follow_pid}/cmdline").read_bytes().split(b"\0")
        assert b"--headless" in argv and argv[argv.index(b"--data-parallel-start-rank") + 1] == b"1"

        auth = secret.headers(run_dir / secret.FILE)
        router = f"http://{node_address(slurm_cluster, 'n1')}:{base_for_job(int(job_id))}"
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "ignore_eos": True}
        for _ in range(8):
            assert post_json(f"{router}/v1/completions", body, auth, timeout=120)["usage"]["completion_tokens"] == 4
        host, port = lead_url.removeprefix("http://").split(":")
        metrics = urllib.request.urlopen(
            f"http://{node_address(slurm_cluster, host)}:{port}/metrics", timeout=30).read().decode()
        served = engine_requests(metrics)
        assert set(served) >= {"0", "1"} and all(v > 0 for v in served.values()), served
        # and the prefill pool took its part of every request (the router pairs both pools)
        url, _, _ = read_ready(ready_dir / "prefill.0")
        host, port = url.removeprefix("http://").split(":")
        metrics = urllib.request.urlopen(
            f"http://{node_address(slurm_cluster, host)}:{port}/metrics", timeout=30).read().decode()
        assert sum(engine_requests(metrics).values()) >= 8
        summary = RunDir(run_dir).benchmark_summary()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and bench_status(summary) not in ("done", "failed"):
            time.sleep(3)
        assert bench_status(summary) == "done", summary.read_text() if summary.exists() else "no summary"
        scraped = wait_for_scrapes(run_dir, {"prefill.0.jsonl", "decode.0.jsonl"}, served=8)

        # the follower dies (SIGKILL by pid): the worker restarts as a whole, on the same nodes and ports
        _, _, lead_pid = read_ready(ready_dir / "decode.0")
        os.kill(follow_pid, signal.SIGKILL)
        deadline = time.monotonic() + 900
        pids: dict[str, int | None] = {}
        while time.monotonic() < deadline:
            pids = {t: read_ready(ready_dir / t)[2] if (ready_dir / t).exists() else None for t in ("decode.0", "decode.1")}
            if pids["decode.0"] not in (None, lead_pid) and pids["decode.1"] not in (None, follow_pid):
                break
            failed = run_dir / "logs" / "attempt-0" / "FAILED"
            assert not failed.exists(), failed.read_text()
            time.sleep(3)
        assert pids["decode.0"] not in (None, lead_pid) and pids["decode.1"] not in (None, follow_pid), pids
        assert read_ready(ready_dir / "decode.0")[0] == lead_url  # same node, same port
        rows = [e for e in events.read(RunDir(run_dir).events) if e.component == "decode"]
        assert [(e.kind, e.task) for e in rows] == [("died", 1), ("restarted", 1)], rows
        assert rows[0].detail["tasks"] == [0, 1] and "137" in rows[0].cause, rows[0]
        st = json.loads(slurm_cluster.slurmrl("status", str(run_dir), "--json", cwd=tmp_path).stdout.splitlines()[-1])
        decode = {c["name"]: c for c in st["components"]}["decode"]
        assert st["state"] == "RUNNING" and decode["restarts"] == 1 and decode["dead"] == [], decode
        host, port = lead_url.removeprefix("http://").split(":")
        again: dict[str, float] = {}
        deadline = time.monotonic() + 300  # the router takes the restarted leader back after its health checks
        while time.monotonic() < deadline and not (set(again) >= {"0", "1"} and all(again.values())):
            try:
                post_json(f"{router}/v1/completions", body, auth, timeout=120)
            except OSError:  # the router has not taken the worker back yet (urllib's errors are OSErrors)
                time.sleep(2)
            again = engine_requests(urllib.request.urlopen(
                f"http://{node_address(slurm_cluster, host)}:{port}/metrics", timeout=30).read().decode())
        assert set(again) >= {"0", "1"} and all(v > 0 for v in again.values()), again  # both engines, new processes
    finally:
        c = slurm_cluster.slurmrl("cancel", str(run_dir), cwd=tmp_path, timeout=180)
    assert c.returncode == 0, c.stdout + c.stderr
    assert scraped, f"the collector kept no scrape of both roles with the 8 requests: {scraped}"
    rep = slurm_cluster.slurmrl("report", str(run_dir), cwd=tmp_path)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    page = RunDir(run_dir).report_page().read_text()
    for panel in ("phases", "throughput", "latency", "queue-kv", "benchmark"):
        assert f'<section id="panel-{panel}"><h2>' in page, panel
    left = slurm_cluster.wait_no_job_processes(job_id)
    assert not left, "left after cancel:\n" + "\n".join(left)
