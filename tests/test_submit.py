"""`slurmrl submit` and `slurmrl diff`: the fit check before sbatch, jobs.json, hand edits,
and one-line errors (exit 2, no traceback) for every user mistake."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from cli_errors import one_line_error

from slurmrl.app.build import render
from slurmrl.slurm import fit
from slurmrl.slurm.script import read_groups

ROOT = Path(__file__).resolve().parent.parent
RL_DEBUG = ROOT / "recipes" / "rl-debug.toml"
PY_OVERRIDE = f'python.executable="{sys.executable}"'


def slurmrl(*args: str, cwd: Path, env: dict | None = None, cluster=None) -> subprocess.CompletedProcess:
    if cluster is not None:
        return cluster.slurmrl(*args, cwd=cwd, env={"SLURMRL_PROBE_TIMEOUT": "30", **(env or {})}, timeout=240)
    return subprocess.run([sys.executable, "-m", "slurmrl", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=60)


# ---- on the cluster -------------------------------------------------------------------------

@pytest.mark.cluster
def test_recipe_larger_than_the_cluster_is_refused_before_sbatch(slurm_cluster, tmp_path):
    name = f"too-big-{uuid.uuid4().hex[:6]}"
    r = slurmrl("submit", str(RL_DEBUG), "--set", f'name="{name}"', "--set", "inference.nodes=8",
                cwd=tmp_path, cluster=slurm_cluster)
    line = one_line_error(r)
    assert "group 1 (inference): needs 8 nodes with 1 GPU and 8 CPUs in partition 'debug'; the cluster has 4" in line
    assert not (tmp_path / "runs").exists()  # nothing written, so no jobs.json either
    assert slurm_cluster.run(["sacct", "-n", "-X", "--name", name]).stdout.strip() == ""

    # no --partition in the script: the cluster's default partition
    r = slurmrl("submit", str(ROOT / "recipes" / "rl-1gpu.toml"), "--set", "slurm.cpus_per_node=16",
                cwd=tmp_path, cluster=slurm_cluster)
    assert "group 0 (rl): needs 1 node with 1 GPU and 16 CPUs in partition 'debug'; the cluster has 0" in (
        one_line_error(r))

    r = slurmrl("submit", str(ROOT / "recipes" / "inference-1node.toml"), cwd=tmp_path, cluster=slurm_cluster)
    assert "group 0 (inference): partition 'gpu' does not exist on this cluster; partitions: debug" in (
        one_line_error(r))
    assert not (tmp_path / "runs").exists()


@pytest.mark.cluster
def test_submit_records_jobs_and_protects_the_run_dir(slurm_cluster, tmp_path):
    r = slurmrl("submit", str(RL_DEBUG), "--set", PY_OVERRIDE, "--preflight", "--timeout", "180",
                cwd=tmp_path, cluster=slurm_cluster)
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "rl-debug-preflight"
    first = json.loads((run_dir / "jobs.json").read_text())
    assert len(first) == 1 and set(first[0]) == {"job_id", "submitted_at", "script_sha256", "edited"}
    job_id = first[0]["job_id"]
    assert f"submitted job {job_id} from {run_dir}" in r.stdout
    for follow_up in (f"slurmrl status {run_dir} --watch", f"slurmrl logs {run_dir} -f", f"slurmrl cancel {run_dir}"):
        assert follow_up in r.stdout
    assert first[0]["script_sha256"] == hashlib.sha256((run_dir / "job.sbatch").read_bytes()).hexdigest()
    assert first[0]["edited"] is False

    # the recipe again: refused over the submitted run dir, unless --force
    again = ["submit", str(RL_DEBUG), "--set", PY_OVERRIDE, "--preflight", "--timeout", "180"]
    line = one_line_error(slurmrl(*again, cwd=tmp_path, cluster=slurm_cluster))
    assert f"was submitted as job {job_id}; use --force" in line
    r = slurmrl(*again, "--force", cwd=tmp_path, cluster=slurm_cluster)
    assert r.returncode == 0, r.stdout + r.stderr
    jobs = json.loads((run_dir / "jobs.json").read_text())
    assert [j["job_id"] for j in jobs][0] == job_id and len(jobs) == 2
    assert (run_dir / "logs" / f"job-{job_id}" / "attempt-0").is_dir()  # the first job's logs, kept aside

    # a hand-edited job.sbatch goes in as it is, through the run dir or the script itself
    script = run_dir / "job.sbatch"
    script.write_text(script.read_text().replace("#SBATCH --time=00:30:00", "#SBATCH --time=00:20:00", 1))
    r = slurmrl("submit", str(script), "--preflight", "--timeout", "180", cwd=tmp_path, cluster=slurm_cluster)
    assert r.returncode == 0, r.stdout + r.stderr
    jobs = json.loads((run_dir / "jobs.json").read_text())
    assert jobs[-1]["edited"] is True
    assert jobs[-1]["script_sha256"] == hashlib.sha256(script.read_bytes()).hexdigest()
    # slurmdbd learns of a job asynchronously: wait for its record, with a deadline
    deadline, limit = time.monotonic() + 60, ""
    while not limit.split() and time.monotonic() < deadline:
        limit = slurm_cluster.run(["sacct", "-j", jobs[-1]["job_id"], "-X", "-n", "-P", "-o", "Timelimit"]).stdout
        time.sleep(0 if limit.split() else 1)
    assert limit.split() and limit.split()[0] == "00:20:00", limit


# ---- diff, the script reader, user mistakes (no cluster) -----------------------------------

def test_diff_shows_hand_edits(tmp_path):
    out = render(RL_DEBUG, [PY_OVERRIDE], run_dir=tmp_path / "run")
    r = slurmrl("diff", str(out.run_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    script = out.run_dir / "job.sbatch"
    script.write_text(script.read_text().replace("GRACE_SECONDS=20", "GRACE_SECONDS=60"))
    r = slurmrl("diff", str(out.run_dir), cwd=tmp_path)
    assert r.returncode == 1
    assert "\n-GRACE_SECONDS=20" in r.stdout and "\n+GRACE_SECONDS=60" in r.stdout
    assert r.stdout.startswith("--- ")


def test_diff_of_a_preflight_run_dir_renders_a_preflight(tmp_path):
    out = render(RL_DEBUG, [PY_OVERRIDE], run_dir=tmp_path / "run", preflight=True)
    assert slurmrl("diff", str(out.run_dir), cwd=tmp_path).returncode == 0


def test_read_groups_from_sbatch_lines():
    text = """#!/bin/bash
# a comment
#SBATCH --job-name=x
#SBATCH -N 2 -p gpu --gres=gpu:a100:4 --cpus-per-task=8 --ntasks-per-node=2  # note
#SBATCH hetjob
#SBATCH --nodes=3-5 --gpus-per-node=h100:2 -c4
echo hi
#SBATCH --nodes=99
"""
    g0, g1 = read_groups(text)
    assert (g0.nodes, g0.partition, g0.gpus_per_node, g0.cpus_per_node) == (2, "gpu", 4, 16)
    assert (g1.nodes, g1.partition, g1.gpus_per_node, g1.cpus_per_node) == (3, None, 2, 4)


def test_gres_counts():
    assert fit.gres_gpus("gpu:4") == 4
    assert fit.gres_gpus("gpu:a100:8(S:0-1)") == 8
    assert fit.gres_gpus("gpu:a100:4,gpu:v100:2(S:0),nic:1") == 6
    assert fit.gres_gpus("(null)") == 0
    assert not fit.Node("n1", 8, 4, "IDLE+DRAIN", ("debug",)).usable
    assert not fit.Node("n1", 8, 4, "DOWN*", ("debug",)).usable
    assert fit.Node("n1", 8, 4, "MIXED", ("debug",)).usable


@pytest.mark.parametrize(
    "args, expected",
    [
        (["submit", "nope.toml"], "nope.toml: no such recipe, run dir or job script"),
        (["submit", "{run}/plan.json"], "give a recipe (.toml), a run dir, or a run dir's job.sbatch"),
        (["submit", "{run}", "--set", "trainer.nodes=2"], "--set: applies to a recipe"),
        (["submit", "--preflight", "{run}"], "--preflight: "),
        (["diff", "{tmp}"], "is not a run dir (no job.sbatch)"),
        (["status", "{run}"], "has no jobs.json: it was never submitted"),
        (["status"], "give a run dir (or run this inside one"),
        (["logs", "{run}", "--component", "nope"], "--component: 'nope' is not a component of this job"),
        (["logs", "{run}", "--attempt", "3"], "--attempt: "),
        (["cancel", "{run}"], "has no jobs.json"),
        (["submit", str(RL_DEBUG), "--set", "inference.nodes=x"], "inference.nodes"),
        (["cancel", "{run}", "--timeout", "-5"], "--timeout: '-5' is out of range (1 to 604800 seconds)"),
        (["cancel", "{run}", "--timeout", "nan"], "--timeout: 'nan' is out of range"),
        (["submit", "{run}", "--preflight", "--timeout", "soon"], "--timeout: needs a number of seconds, not 'soon'"),
    ],
)
def test_user_mistakes_are_one_line(tmp_path, args, expected):
    run = render(RL_DEBUG, [PY_OVERRIDE], run_dir=tmp_path / "run").run_dir
    args = [a.format(run=run, tmp=tmp_path) for a in args]
    line = one_line_error(slurmrl(*args, cwd=tmp_path))
    assert expected in line, line


def test_sbatch_missing_is_one_line(tmp_path):
    run = render(RL_DEBUG, [PY_OVERRIDE], run_dir=tmp_path / "run").run_dir
    line = one_line_error(slurmrl("submit", str(run), cwd=tmp_path, env={"PATH": "/nonexistent"}))
    assert "not found on PATH" in line
    assert not (run / "jobs.json").exists()
