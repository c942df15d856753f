"""An inference-only recipe on the local Slurm cluster with real vLLM and vllm-router.

recipes/inference-debug.toml: two vLLM servers (two nodes) and vllm-router on the first. A vLLM flag is
edited by hand in the rendered job.sbatch first: `diff` must show it, `submit RUN_DIR` must
record it, and both servers must run with it. The job must become ready, answer through the
router, keep serving when one replica is killed, and cancel cleanly. Ready means serving: both
servers registered behind the router and one completion through it (phases); with
model.stage = "node-local" each server's vLLM reads the copy made on its own node.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cluster_jobs import node_address, status
from live_components import post_json

from slurmrl import secret
from slurmrl.ports import base_for_job
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import read_ready
from slurmrl.runtime.fixtures.tiny_model import build as build_tiny

pytestmark = [pytest.mark.cluster, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parent.parent


def ready_pids(run_dir: Path) -> dict[str, int]:
    """component.task -> pid of the command its supervisor started (from its ready file)."""
    out = {}
    for f in (run_dir / "ready" / "attempt-0").iterdir():
        _, _, pid = read_ready(f)
        if pid:
            out[f.name] = pid
    return out


def test_inference_job_runs_a_hand_edit_serves_survives_a_dead_replica_and_cancels(slurm_cluster, tmp_path):
    model = build_tiny(tmp_path / "tiny")
    r = slurm_cluster.slurmrl(
        "render", str(ROOT / "recipes" / "inference-debug.toml"),
        "--set", f'model.path="{model}"', "--set", f'python.executable="{sys.executable}"',
        "--set", 'inference.env.VLLM_CPU_KVCACHE_SPACE="1"', "--set", "slurm.grace_seconds=5",
        "--set", "model.max_model_len=128",
        "--set", 'model.stage="node-local"', "--set", f'model.stage_dir="{tmp_path / "stage"}"',
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "inference-debug"
    # the user edits one vLLM flag, once, in the script: every server of the component gets it
    script = run_dir / "job.sbatch"
    text = script.read_text()
    assert text.count("--max-model-len 128") == 1
    script.write_text(text.replace("--max-model-len 128", "--max-model-len 96"))
    d = slurm_cluster.slurmrl("diff", str(run_dir), cwd=tmp_path)
    assert d.returncode == 1, d.stdout + d.stderr
    assert "-        --max-model-len 128" in d.stdout and "+        --max-model-len 96" in d.stdout
    r = slurm_cluster.slurmrl("submit", str(run_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "edited by hand" in r.stdout
    record = json.loads((run_dir / "jobs.json").read_text())[-1]
    assert record["edited"] is True
    job_id = record["job_id"]
    try:
        deadline = time.monotonic() + 600
        ready = set()
        while time.monotonic() < deadline:
            ready = {f.name for f in (run_dir / "ready" / "attempt-0").glob("*")} if (run_dir / "ready").exists() else set()
            if {"inference.0", "inference.1", "router.0"} <= ready:
                break
            assert not (run_dir / "logs" / "attempt-0" / "FAILED").exists(), (
                (run_dir / "logs" / "attempt-0" / "FAILED").read_text())
            time.sleep(3)
        assert {"inference.0", "inference.1", "router.0"} <= ready, f"not ready: {ready}"
        # ready means serving: both servers registered behind the router, one completion through it
        phases = " | ".join(what for _, what in RunDir(run_dir).read_phases(0))
        assert "router workers registered: 2 of 2 after" in phases and "router serving: a completion" in phases, phases

        # the job made its secret; every request needs it (through the router too)
        auth = secret.headers(run_dir / secret.FILE)
        assert auth and secret.read(run_dir / secret.FILE) not in (run_dir / "job.sbatch").read_text()
        # the edited flag reached both servers: in their argv, and in what vLLM reports
        for task in ("inference.0", "inference.1"):
            url, ntasks, pid = read_ready(run_dir / "ready" / "attempt-0" / task)
            assert ntasks == 2
            host, port = url.removeprefix("http://").split(":")
            req = urllib.request.Request(f"http://{node_address(slurm_cluster, host)}:{port}/v1/models",
                                         headers=auth)
            models = json.loads(urllib.request.urlopen(req, timeout=30).read())
            assert models["data"][0]["max_model_len"] == 96
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert argv[argv.index(b"--max-model-len") + 1] == b"96"
            # model.stage = "node-local": vLLM loaded the copy on its own node, made before it started
            assert argv[argv.index(b"--model") + 1].decode() == f"{tmp_path / 'stage'}/{host}/{model.name}-" + \
                hashlib.sha256(str(model).encode()).hexdigest()[:8]
        assert len([w for w in phases.split(" | ") if w.startswith("model staged on ") and "cache miss" in w]) == 2

        router_url, _, _ = read_ready(run_dir / "ready" / "attempt-0" / "router.0")
        router_host = router_url.removeprefix("http://").split(":")[0]  # the job's first node, whichever it got
        router = f"http://{node_address(slurm_cluster, router_host)}:{base_for_job(int(job_id))}"
        body = {"model": str(model), "prompt": "hello", "max_tokens": 4, "ignore_eos": True}
        assert post_json(f"{router}/v1/completions", body, auth)["usage"]["completion_tokens"] == 4
        with pytest.raises(urllib.error.HTTPError, match="401"):
            post_json(f"{router}/v1/completions", body, {"Authorization": "Bearer not-the-secret"})

        # kill one replica's vLLM (by the pid its ready file recorded): serving goes on
        victim = ready_pids(run_dir)["inference.1"]
        os.kill(victim, signal.SIGKILL)
        time.sleep(12)  # the router's health check (every 5 s) takes it out of rotation
        answered = [post_json(f"{router}/v1/completions", body, auth, timeout=60) for _ in range(8)]
        assert all(a["usage"]["completion_tokens"] == 4 for a in answered)
        st = status(slurm_cluster, run_dir, tmp_path)
        assert "RUNNING" in json.dumps(st)
    finally:
        c = slurm_cluster.slurmrl("cancel", str(run_dir), cwd=tmp_path, timeout=180)
    assert c.returncode == 0, c.stdout + c.stderr
    assert "CANCELLED" in c.stdout
    for name, pid in ready_pids(run_dir).items():
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(1)
        assert not Path(f"/proc/{pid}").exists(), f"{name} (pid {pid}) still running after cancel"
    # nothing the job started is left on any node: not the killed server's EngineCore, not a tracker
    left = slurm_cluster.wait_no_job_processes(job_id)
    assert not left, "left after cancel:\n" + "\n".join(left)
