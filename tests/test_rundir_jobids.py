"""Issue 27 item 2: a job id read back from a run dir never reaches a Slurm command as an option.

Checked twice: where it is read (slurmrl.rundir) and in the one transport every Slurm command goes
through (slurmrl.slurm.tools.call, the transport's argv/exec, and the --cluster SSH transport).
The CLI tests put test doubles of scancel/squeue/sacct/scontrol first on PATH: they record their
argv, so a test sees exactly what would have run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmrl.errors import UserError
from slurmrl.remote.transport import Remote
from slurmrl.rundir.jobids import check_argv, check_job_id, is_job_id
from slurmrl.slurm import tools

ROOT = Path(__file__).resolve().parent.parent
GOOD = ["1", "42", "123_4", "123_[1-3,5]", "123_[0-15%4]", "123+0", "123+12", "9999999"]
STEPS = ["123.batch", "123.0", "123+1.4", "123_4.extern"]
BAD = ["-1", "--me", "--user=root", "-u", "1;rm -rf ~", "1\n2", "1 2", "", "0", "01", "1_", "1+", "1_[", "a",
       "$(id)", "`id`", "1\r", "1\0", "1２", "1,2", "1.batch.x", "1 --me"]


@pytest.mark.parametrize("job_id", GOOD)
def test_slurm_job_ids(job_id):
    assert is_job_id(job_id) and check_job_id(job_id, "x") == job_id


@pytest.mark.parametrize("job_id", STEPS)
def test_steps_only_where_steps_are_meant(job_id):
    assert is_job_id(job_id, steps=True) and not is_job_id(job_id)


@pytest.mark.parametrize("job_id", BAD)
def test_not_job_ids(job_id):
    with pytest.raises(UserError, match="not a Slurm job id"):
        check_job_id(job_id, "jobs.json")


@given(st.text(max_size=30))
@settings(max_examples=300, deadline=None)
def test_nothing_that_could_be_an_option_or_shell_is_a_job_id(text):
    if is_job_id(text, steps=True):
        assert text[0] in "123456789" and text.isascii()
        assert not set(text) & set(" \t\n\r\0;|&$`'\"\\<>(){}=-/")


# ---- the one transport -------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["scancel", "--me"], ["scancel", "-u", "root"], ["scancel", "--user=root"], ["scancel", "5"],
    ["scancel", "--", "--me"], ["scancel", "--", "5", "-1"], ["scancel", "--"], ["scancel", "--", "1\n2"],
    ["squeue", "--jobs=--me"], ["squeue", "-j", "-1"], ["squeue", "--jobs=1,--me"], ["squeue", "-j"],
    ["sacct", "--jobs=1;x"], ["sacct", "-j", ""], ["scontrol", "show", "job", "--me"],
    ["scontrol", "requeue", "-1"], ["srun", "--overlap", "--jobid=--me", "hostname"], ["srun", "--jobid", "5"],
])
def test_the_transport_refuses_an_id_that_is_not_one(argv):
    with pytest.raises(UserError):
        check_argv(argv)


@pytest.mark.parametrize("argv", [
    ["scancel", "--", "5"], ["scancel", "--", "5_[1-3]", "6+1"], ["scancel", "--signal=TERM", "--batch", "--", "5"],
    ["squeue", "--jobs=5", "-h", "-o", "%i|%T"], ["squeue", "--jobs=5,6_1,7_[1-2,4]"], ["squeue", "-j", "5"],
    ["sacct", "-o", "JobID,State", "--parsable2", "--jobs=5", "--jobs=6"], ["scontrol", "show", "job", "5"],
    ["scontrol", "show", "hostnames", "n[1-3]"], ["scontrol", "show", "node", "-o"],
    ["srun", "--overlap", "--jobid=5", "--het-group=1", "-w", "n1", "bash", "-c", "echo a\necho -j x"],
    ["sbatch", "--parsable", "job.sbatch"], ["sbatch", "--dependency=afterany:5", "x.sbatch"],
])
def test_the_transport_passes_what_slurmrl_runs(argv):
    check_argv(argv)


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_call_runs_nothing_for_an_option_looking_id(doubles):
    with pytest.raises(UserError, match="scancel"):
        tools.call(["scancel", "--", "--me"])
    assert calls(doubles) == []
    tools.call(["scancel", "--", "5"])
    assert [c[1:] for c in calls(doubles)] == [["--", "5"]]


def test_argv_for_submitit_is_checked_too():
    with pytest.raises(UserError):
        tools.transport().argv(["sacct", "-o", "State", "--jobs=-1"])


class RecordingConnection:
    """Stands in for the SSH connection: records what would have been sent."""

    label = "cluster test"

    def __init__(self):
        self.sent: list = []

    def run(self, command, input=None, timeout=None):
        self.sent.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    def argv(self, command):
        self.sent.append(command)
        return ["ssh", command]

    def exec(self, command, pty):
        self.sent.append(command)


@pytest.mark.parametrize("method", ["run", "argv", "exec"])
def test_the_ssh_transport_checks_before_anything_leaves(method):
    remote = Remote.__new__(Remote)
    remote.name, remote.conn = "test", RecordingConnection()
    bad = ["scancel", "--", "--me"] if method != "exec" else ["srun", "--jobid=--me", "hostname"]
    with pytest.raises(UserError):
        {"run": lambda: remote.run(bad, 5), "argv": lambda: remote.argv(bad),
         "exec": lambda: remote.exec(bad, {}, False)}[method]()
    assert remote.conn.sent == []


# ---- the CLI, end to end on a run dir with a hostile jobs.json ----------------------------------
def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "slurmrl.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


def run_dir_with(tmp_path: Path, jobs) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    (d / "job.sbatch").write_text("#!/bin/bash\n")
    (d / "jobs.json").write_text(json.dumps(jobs))
    return d


@pytest.mark.parametrize("job_id", ["--me", "-1", "1;rm -rf ~", "1\n2", "--user=root", "1 --me", 0])
@pytest.mark.parametrize("verb", ["cancel", "status", "logs", "attach"])
def test_a_hostile_jobs_json_runs_no_slurm_command(tmp_path, doubles, verb, job_id):
    d = run_dir_with(tmp_path, [{"job_id": job_id}])
    args = [verb, str(d)] + (["server"] if verb == "attach" else []) + (["--timeout", "1"] if verb == "cancel" else [])
    r = cli(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.splitlines()) == 1 and "jobs.json" in r.stderr and "Traceback" not in r.stderr
    assert calls(doubles) == []


def test_cancel_passes_the_id_after_double_dash(tmp_path, doubles):
    d = run_dir_with(tmp_path, [{"job_id": "77"}])
    cli("cancel", str(d), "--timeout", "1", cwd=tmp_path)
    scancels = [c[1:] for c in calls(doubles) if c[0].endswith("scancel")]
    assert scancels == [["--", "77"]]
    queried = [c[1:] for c in calls(doubles) if c[0].endswith(("squeue", "sacct"))]
    assert queried and all("--jobs=77" in c and "77" not in c for c in queried)  # never a bare word


def test_cancel_of_a_sweep_with_a_hostile_index_runs_nothing(tmp_path, doubles):
    s = tmp_path / "s-sweep"
    s.mkdir()
    (s / "sweep.json").write_text(json.dumps({"name": "s", "points": [{"index": 0, "name": "s-p0", "values": {}}],
                                              "submissions": [{"mode": "jobs", "job_ids": ["--me"]}]}))
    r = cli("cancel", str(s), "--timeout", "1", cwd=tmp_path)
    assert r.returncode == 2 and "sweep.json" in r.stderr and len(r.stderr.splitlines()) == 1
    assert calls(doubles) == []
