"""Truthful status without a cluster (issue 27 item 8): the Slurm test double (tests/support/fake_slurm/) knows
no job, so every job id a run dir names is one Slurm has never heard of.

- `slurmrl status` of such a job (past the grace after its submission) is one line on stderr and exit 2,
  for a run dir, its job.sbatch, a bare job id and --json (what the run dir says still goes to stdout);
  within the grace it asks again until the grace ends.
- every command that plans (validate, plan, render, submit of a recipe, sweep) prints the plan's
  warnings on stderr as `slurmrl: warning: ...`, each distinct one once.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from fake_slurm_runs import ROOT, error_text, rendered_run_dir, run
from fake_slurm_runs import submitted as submitted_calls

from slurmrl.app import status as status_mod
from slurmrl.app.status_report import StatusReport
from slurmrl.app.status_text import text
from slurmrl.errors import UserError
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.steps.attempts import requeues_used


def write_jobs(run_dir, job_id: str, submitted_at: str | None) -> None:
    RunDir(run_dir).jobs.write_text(json.dumps([{"job_id": job_id, "submitted_at": submitted_at,
                                                 "script_sha256": None}]) + "\n")


@pytest.mark.parametrize("form", ["dir", "script", "json", "cwd"])
def test_status_of_a_job_slurm_never_heard_of_is_an_error(tmp_path, form):
    run_dir = rendered_run_dir(tmp_path)
    old = (datetime.now(UTC) - timedelta(hours=1)).isoformat(timespec="seconds")
    write_jobs(run_dir, "4242", old)
    args = {"dir": [str(run_dir)], "script": [str(RunDir(run_dir).script)], "json": [str(run_dir), "--json"],
            "cwd": []}[form]
    r, calls = run("status", *args, cwd=run_dir if form == "cwd" else tmp_path)
    line = error_text(r)
    assert "4242" in line and "not known to squeue or sacct" in line, line
    # what the run dir itself says still goes to stdout (the job's FAILED, metrics, ...)
    assert "4242" in r.stdout and "Traceback" not in r.stdout
    assert any(c[0] == "sacct" for c in calls), calls


@pytest.mark.parametrize("submitted_at", [None, "not a time", "1999-01-01T00:00:00+00:00"])
def test_a_job_without_a_readable_submission_time_is_an_error_at_once(tmp_path, submitted_at):
    run_dir = rendered_run_dir(tmp_path)
    write_jobs(run_dir, "4243", submitted_at)
    started = time.monotonic()
    r, _ = run("status", str(run_dir), cwd=tmp_path)
    assert "4243" in error_text(r)
    assert time.monotonic() - started < status_mod.NOT_FOUND_AFTER_S


def test_status_of_a_bare_unknown_job_id_is_an_error(tmp_path):
    r, _ = run("status", "987654", cwd=tmp_path)
    assert "987654" in error_text(r)


def test_within_the_grace_status_asks_again_until_the_grace_ends(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_jobs(run_dir, "77", datetime.now(UTC).isoformat(timespec="seconds"))
    monkeypatch.setattr(status_mod, "NOT_FOUND_AFTER_S", 2.0)
    asked = []

    class NeverKnown:
        job_id = "77"

        def snapshot(self):
            asked.append(time.monotonic())
            return status_mod.Snapshot("77", "UNKNOWN")

    assert not status_mod.first_snapshot(NeverKnown(), run_dir).parts
    with pytest.raises(UserError, match="77.*not known"):
        raise status_mod.not_known("77", run_dir)
    assert len(asked) >= 2 and asked[-1] - asked[0] <= 3.5


def test_a_submission_time_in_the_future_waits_one_grace_at_most(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_jobs(run_dir, "78", "2999-01-01T00:00:00+00:00")
    monkeypatch.setattr(status_mod, "NOT_FOUND_AFTER_S", 1.0)
    monkeypatch.setattr(status_mod.Watch, "snapshot", lambda self: status_mod.Snapshot(self.job_id, "UNKNOWN"))
    started = time.monotonic()
    assert not status_mod.first_snapshot(status_mod.Watch("78"), run_dir).parts
    assert time.monotonic() - started < 3


# ---- every command that plans prints the same warnings -----------------------------------------
INF = ROOT / "recipes" / "inference-debug.toml"
EARLY = ["--set", "slurm.time=10", "--set", "slurm.signal=USR2"]  # fires at 540 s, before startup_timeout


def warnings_of(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    assert "Traceback" not in stderr and all(ln.startswith("slurmrl: warning: ") for ln in lines), stderr
    return [ln.removeprefix("slurmrl: warning: ") for ln in lines]


@pytest.mark.parametrize("verb", [["validate"], ["plan"], ["plan", "--json"], ["render"], ["render", "--stdout"],
                                  ["submit"]])
def test_every_verb_that_plans_prints_the_plans_warnings_on_stderr(tmp_path, verb):
    r, calls = run(*verb, str(INF), *EARLY, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    said = warnings_of(r.stderr)
    assert len(said) == 1 and "slurm.signal USR2@60 fires 540 s" in said[0], said
    assert (verb == ["submit"]) == bool(submitted_calls(calls))


@pytest.mark.parametrize("render_only", [True, False])
def test_a_sweep_prints_each_distinct_warning_once(tmp_path, render_only):
    r, calls = run("sweep", str(INF), *EARLY, "--grid", "inference.gpu_memory_utilization=0.5,0.6,0.7",
                   *(["--render-only"] if render_only else []), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    said = warnings_of(r.stderr)
    assert len(said) == 1 and "fires 540 s" in said[0], said
    assert bool(submitted_calls(calls)) != render_only


@pytest.mark.parametrize("verb", [["validate"], ["plan"], ["render"], ["submit"]])
def test_a_recipe_without_warnings_prints_none(tmp_path, verb):
    r, _ = run(*verb, str(INF), cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr


# ---- every requeue the job used counts, a manual one none ---------------------------------------
def test_the_warning_signals_and_node_faults_requeues_count_against_max_requeues(tmp_path):
    logs = tmp_path / "logs"
    for a, (name, note) in enumerate([("PREEMPTED", "warning signal: requeued as attempt 1"),
                                      ("STOPPED", "got SIGTERM from Slurm (requeued by Slurm (scontrol requeue, or a "
                                                  "preemption that requeues): attempt 2 follows)"),
                                      ("END", "1765071000 node yes node(s) n2 bad (trainer exited with code 135 "
                                              "(SIGBUS)); requeued as attempt 3 without them"),
                                      ("END", "1765071300 node no node(s) n3 bad; not requeued: slurm.requeue is off"),
                                      ("PREEMPTED", "warning signal: slurm.requeue is off")]):
        (logs / f"attempt-{a}").mkdir(parents=True)
        (logs / f"attempt-{a}" / name).write_text(note + "\n")
    assert [requeues_used(tmp_path, a) for a in range(6)] == [0, 1, 1, 2, 2, 2]
    rep = StatusReport(status_mod.Snapshot("7", "RUNNING"), "/r", attempt=3, max_requeues=3, requeues_used=1)
    assert text(rep).splitlines()[0] == "job 7: RUNNING  (attempt 3, 2 requeue(s) left, run dir /r)"
    # what status itself reads from the run dir: the node fault's requeue is one of them
    rep.attempt, rep.requeues_used = 4, requeues_used(tmp_path, 4)
    assert text(rep).splitlines()[0] == "job 7: RUNNING  (attempt 4, 1 requeue(s) left, run dir /r)"
