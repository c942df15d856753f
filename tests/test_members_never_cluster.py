"""`restart = "never"` on the local Slurm with two real vLLM servers behind the router (issue 41): one job,
rl-debug with ``inference.gpus_per_node = 2``. The engine of server 1 is SIGKILLed at step 3: it is not
restarted, the orchestrator routes around it and the steps go on on the survivor, every prompt group
whole, and `status` shows it dead. Then server 0's engine is SIGKILLed too: with every server dead and no
restart to wait for, the job ends FAILED once ``inference.startup_timeout`` has passed, naming both servers
and why each died."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cluster_jobs import kill_engine, lines, server_pid, status, wait

from slurmrl.contract import events
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.fixtures.tiny_model import build as build_tiny

pytestmark = [pytest.mark.cluster, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parent.parent
KILL_ONE_AT, ON_SURVIVOR = 3, 3  # steps before the first kill, then steps on the survivor alone
DEADLINE_S = 180  # inference.startup_timeout: how long fewer than min_servers may last (a tiny model starts in ~1 min)


def test_never_restarted_a_dead_server_is_routed_around_and_all_dead_fails_naming_them(slurm_debug2, tmp_path):
    model = build_tiny(tmp_path / "tiny")
    r = slurm_debug2.slurmrl(
        "submit", str(ROOT / "recipes" / "rl-debug.toml"),
        "--set", f'model.path="{model}"', "--set", f'python.executable="{sys.executable}"',
        "--set", "trainer.max_steps=200", "--set", "inference.gpus_per_node=2",
        "--set", 'inference.restart="never"', "--set", f"inference.startup_timeout={DEADLINE_S}",
        "--set", "slurm.requeue=false",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "rl-debug"
    metrics = run_dir / "metrics" / "orchestrator.jsonl"
    try:
        wait(lambda: len(lines(metrics)) >= KILL_ONE_AT, f"{KILL_ONE_AT} batches", 900, run_dir)
        one, other = server_pid(run_dir, 1), server_pid(run_dir, 0)
        assert one is not None and other is not None
        kill_engine(one)
        wait(lambda: ("dead", 1) in [(e.kind, e.task) for e in events.read(RunDir(run_dir).events)],
             "inference.1 declared dead", 300, run_dir)
        after = len(lines(metrics))
        wait(lambda: len(lines(metrics)) >= after + ON_SURVIVOR, f"{ON_SURVIVOR} batches on the survivor", 600, run_dir)
        text = slurm_debug2.slurmrl("status", str(run_dir), cwd=tmp_path).stdout
        assert "RUNNING" in text and "dead" in text, text
        kill_engine(other)
        wait(lambda: RunDir(run_dir).failed_file(0).exists() or None, "the job to fail", DEADLINE_S + 600, run_dir=tmp_path)
        wait(lambda: status(slurm_debug2, run_dir, tmp_path)["state"] in ("FAILED", "COMPLETED"), "the job to end",
             300, run_dir=tmp_path)
        rep = status(slurm_debug2, run_dir, tmp_path)
    finally:
        slurm_debug2.slurmrl("cancel", str(run_dir), cwd=tmp_path, timeout=180)
    got = lines(metrics)
    assert [x["step"] for x in got] == list(range(1, len(got) + 1)) and len(got) >= KILL_ONE_AT + ON_SURVIVOR
    assert {x["samples"] for x in got} == {4 * 8}  # every batch whole, on two servers or one
    assert any(x["servers_live"] == 1 for x in got), got
    kinds = [(e.kind, e.task) for e in events.read(RunDir(run_dir).events)]
    assert ("dead", 1) in kinds and ("dead", 0) in kinds and not any(k == "restarted" for k, _ in kinds), kinds
    assert rep["state"] == "FAILED", rep
    failed = rep["failed"] or {}
    reason = json.dumps(failed)
    assert "fewer than inference.min_servers = 1" in reason and "(task 0) dead" in reason and "(task 1) dead" in reason, failed
