"""Nothing survives a kill at any level, on the real local Slurm.

inference-debug with tests/support/ok_server.py in place of vLLM (a test double: this is about process
trees and the script, not the engine) and the real vllm-router. For each level of one replica's
tree (supervisor, guard, the server itself) and for the router, `kill -9` it: the replica's whole
tree ends (servers have kill-on-bad-exit=0, so the job serves on) or the job fails naming the
router; after the job ends no process of the job is left on any node and no port of it answers.
The job runs with `restart = "never"` (servers and router): this is about what a kill leaves behind;
tests/test_restart_cluster.py restarts them in place.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest
from cluster_jobs import node_address
from script_edits import serve_with_ok_server

from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import read_ready

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parent.parent


def answers(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=2):
            return True
    except OSError:
        return False


def wait(predicate, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def start_job(cluster, tmp_path: Path) -> tuple[Path, str]:
    r = cluster.slurmrl("render", str(ROOT / "recipes" / "inference-debug.toml"), "--set",
                        f'python.executable="{sys.executable}"', "--set", "slurm.grace_seconds=3",
                        "--set", 'inference.restart="never"', "--set", 'inference.router.restart="never"', cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "runs" / "inference-debug"
    script = run_dir / "job.sbatch"
    script.write_text(serve_with_ok_server(script.read_text()))
    r = cluster.slurmrl("submit", str(run_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = str(json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"])
    wait(lambda: RunDir(run_dir).ready_file(0, "router", 0).exists(), "the router to be ready", 120)
    return run_dir, job_id


def tree_of(run_dir: Path, component: str, task: int) -> dict[str, int]:
    """pids of one task's levels: the command (from its ready file), its guard and supervisor."""
    _, _, pid = read_ready(RunDir(run_dir).ready_file(0, component, task))
    command = psutil.Process(pid)
    guard = command.parent()
    supervisor = guard.parent()
    assert "slurmrl.runtime.steps.guard" in " ".join(guard.cmdline())
    assert "slurmrl.runtime.steps.supervise" in " ".join(supervisor.cmdline())
    return {"supervisor": supervisor.pid, "guard": guard.pid, "command": command.pid}


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("level", ["supervisor", "guard", "command"])
def test_kill_9_at_any_level_of_a_replica(slurm_cluster, tmp_path, level):
    run_dir, job_id = start_job(slurm_cluster, tmp_path)
    try:
        pids = tree_of(run_dir, "inference", 0)
        url, _, _ = read_ready(RunDir(run_dir).ready_file(0, "inference", 0))
        host, port = url.removeprefix("http://").split(":")
        os.kill(pids[level], signal.SIGKILL)
        for name, pid in pids.items():
            wait(lambda pid=pid: gone(pid), f"{name} (pid {pid}) to end after kill -9 of the {level}")
        wait(lambda: not answers(node_address(slurm_cluster, host), int(port)), "the dead replica's port to close")
        # the other replica serves on: the job is still running, and status says the replica is dead
        # and no longer lists it among the endpoints
        assert "RUNNING" in slurm_cluster.run(["squeue", "-h", "-j", job_id, "-o", "%T"]).stdout
        rep = json.loads(slurm_cluster.slurmrl("status", str(run_dir), "--json", cwd=tmp_path).stdout)
        assert url not in [e["url"] for e in rep["endpoints"]] and url not in rep["serving"]["urls"], rep["endpoints"]
        inference = {c["name"]: c for c in rep["components"]}["inference"]
        assert [d["task"] for d in inference["dead"]] == [0] and 0 not in inference["ready"], inference
        assert "code 137" in inference["dead"][0]["cause"] or "killed" in inference["dead"][0]["cause"], inference
    finally:
        slurm_cluster.slurmrl("cancel", str(run_dir), cwd=tmp_path, timeout=120)
    assert not slurm_cluster.wait_no_job_processes(job_id)


def test_kill_9_of_the_router_fails_the_job_and_leaves_nothing(slurm_cluster, tmp_path):
    run_dir, job_id = start_job(slurm_cluster, tmp_path)
    try:
        pids = tree_of(run_dir, "router", 0)
        os.kill(pids["command"], signal.SIGKILL)
        failed = RunDir(run_dir).failed_file(0)
        wait(failed.exists, "the job to fail")
        assert "router exited" in failed.read_text()
    finally:
        slurm_cluster.slurmrl("cancel", str(run_dir), cwd=tmp_path, timeout=120)
    left = slurm_cluster.wait_no_job_processes(job_id)
    assert not left, left
    for task in (0, 1):
        url, _, _ = read_ready(RunDir(run_dir).ready_file(0, "inference", task))
        host, port = url.removeprefix("http://").split(":")
        assert not answers(node_address(slurm_cluster, host), int(port))
