"""The trainer's levels on the real local Slurm: kill -9 of torchrun, kill -9 of the trainer worker,
and a hung worker (SIGSTOP): each ends the job naming the trainer and how it ended (the signal that
killed torchrun or, from torchrun's record of it, the worker), and nothing of the job is left.

Before: `kill -9` of torch.distributed.run left the trainer worker (ppid 1) waiting forever. The
three jobs (sft-debug on the tiny model, one node each) run at once.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.fixtures.tiny_model import build as build_tiny

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parent.parent
HANG_S = 15  # a loaded 2-core machine must not make a healthy step look hung


def wait(predicate, what: str, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def send(proc: psutil.Process, sig: int) -> bool:
    """Signal ``proc``; False when it had already ended (under load a job can end before the test acts)."""
    try:
        proc.send_signal(sig)  # psutil checks the pid was not reused
        return True
    except psutil.NoSuchProcess:
        return False


def trainer_levels(cluster, job_id: str) -> dict[str, psutil.Process]:
    """torchrun (the launcher) and the trainer worker it started, found by the job's environment."""
    found = {}
    for line in cluster.job_processes(job_id):
        pid, cmd = line.split(" ", 1)
        if "slurmrl.runtime.steps.supervise" in cmd or "slurmrl.runtime.steps.guard" in cmd:
            continue
        if "bin/torchrun" in cmd:
            found["torchrun"] = psutil.Process(int(pid))
        elif "-m slurmrl.runtime.trainer" in cmd:
            found["worker"] = psutil.Process(int(pid))
    return found if len(found) == 2 else {}


def test_kill_9_or_a_hang_at_each_trainer_level_ends_the_job_and_leaves_nothing(slurm_cluster, tmp_path):
    tiny = build_tiny(tmp_path / "tiny")
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {i}:", "completion": f" {i}\n"}) + "\n" for i in range(32)))
    jobs = {}
    for case in ("kill-torchrun", "kill-worker", "hang-worker"):
        cwd = tmp_path / case
        cwd.mkdir()
        r = slurm_cluster.slurmrl(
            "submit", str(ROOT / "recipes" / "sft-debug.toml"),
            "--set", f'model.path="{tiny}"', "--set", f'python.executable="{sys.executable}"',
            "--set", f'trainer.dataset="{data}"', "--set", "trainer.max_steps=100000",
            "--set", "trainer.checkpoint_every=100000", "--set", "slurm.grace_seconds=3",
            "--set", f"slurm.heartbeat_timeout={HANG_S}", cwd=cwd)
        assert r.returncode == 0, r.stdout + r.stderr
        run_dir = cwd / "runs" / "sft-debug"
        jobs[case] = (run_dir, str(json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]))
    try:
        levels = {}
        for case, (run_dir, job_id) in jobs.items():
            # training: the worker has beaten its heart (so the hang watch is on)
            wait(RunDir(run_dir).heartbeat_file(0, "trainer", 0).exists, f"{case}: the trainer to step")
            levels[case] = wait(lambda: trainer_levels(slurm_cluster, job_id), f"{case}: the trainer's processes")
        landed = {case: send(levels[case][level], sig) for case, level, sig in (
            ("kill-torchrun", "torchrun", signal.SIGKILL), ("kill-worker", "worker", signal.SIGKILL),
            ("hang-worker", "worker", signal.SIGSTOP))}
        for case, (run_dir, job_id) in jobs.items():
            failed = RunDir(run_dir).failed_file(0)
            wait(failed.exists, f"{case}: the job to fail", timeout=120)
            reason = failed.read_text()
            assert "trainer" in reason, (case, reason)
            if case == "hang-worker" and landed[case]:
                assert "hung" in reason and "heartbeat" in reason, reason
            if case == "kill-worker" and landed[case]:  # torchrun's record of its worker: the signal, not what the log said last
                worker = levels[case]["worker"].pid
                assert f"trainer: worker rank 0 (pid {worker}) killed by SIGKILL" in reason, reason
            if case == "kill-torchrun" and landed[case]:
                assert "trainer exited with code 137 (SIGKILL)" in reason, reason
            left = slurm_cluster.wait_no_job_processes(job_id, timeout=90)
            assert not left, (case, left)
            for p in levels[case].values():
                assert not p.is_running() or p.status() == psutil.STATUS_ZOMBIE, (case, p)
    finally:
        for run_dir, _ in jobs.values():
            slurm_cluster.slurmrl("cancel", str(run_dir), cwd=run_dir.parent.parent, timeout=120)
