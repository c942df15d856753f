"""`slurmrl status`, `logs` and `cancel` on real jobs of the local cluster.

The jobs are rl-debug rendered normally (het job: trainer + orchestrator in group 0, inference in
group 1, the real stages and readiness waits), with ``python.executable`` pointing at a stand-in
"python" that runs the preflight probe in place of each component's supervisor (it serves the
ports the readiness checks poll and writes the ready file). Two switches, passed through the job's environment, make
one component misbehave: SLURMRL_TEST_HOLD=<component> keeps running after its probe (a job that
stays up), SLURMRL_TEST_FAIL=<component> exits 3 at once, SLURMRL_TEST_STALL=<component> never
becomes ready, SLURMRL_TEST_RAISE=<component> runs the Python file SLURMRL_TEST_PROGRAM under the real
step supervisor.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from polling import wait_for
from status_jobs import FAKE_PYTHON, cancel_until_gone, status_json

ROOT = Path(__file__).resolve().parent.parent
RL_DEBUG = ROOT / "recipes" / "rl-debug.toml"
GRACE = 5


@pytest.fixture
def job(slurm_cluster, tmp_path):
    """submit(**env) -> run dir of a submitted rl-debug job; cancels it at teardown."""
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    submitted = []

    def submit(*sets: str, **env) -> Path:
        extra = [x for s in sets for x in ("--set", s)]
        r = slurm_cluster.slurmrl("submit", str(RL_DEBUG), "--set", f'python.executable="{fake}"',
                                  "--set", f"slurm.grace_seconds={GRACE}", *extra, cwd=tmp_path,
                                  env={"SLURMRL_PROBE_TIMEOUT": "30", **env})
        assert r.returncode == 0, r.stdout + r.stderr
        run_dir = tmp_path / "runs" / "rl-debug"
        submitted.append(json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"])
        return run_dir

    yield submit
    for job_id in submitted:
        cancel_until_gone(slurm_cluster, job_id)


@pytest.mark.cluster
def test_status_logs_cancel_on_a_running_job(slurm_cluster, job, tmp_path):
    run_dir = job(SLURMRL_TEST_HOLD="trainer")

    def trainer_running():
        rep = status_json(slurm_cluster, run_dir)
        comps = {c["name"]: c for c in rep["components"]}
        step = comps["trainer"]["step"] or {}
        # "+0." in the step id: accounting has caught up (for a few seconds after a step starts,
        # sacct lists a het job's steps as <id>.<n>, without their component)
        ok = (rep["state"] == "RUNNING" and step.get("state") == "RUNNING" and "+0." in step.get("id", "")
              and comps["trainer"]["ready"] == [0] and comps["inference"]["ready"] == [0])
        return rep if ok else None

    rep = wait_for(trainer_running, "the trainer step to run and every component to be ready")
    assert [p["id"] for p in rep["parts"]] == [f"{rep['job_id']}+0", f"{rep['job_id']}+1"]
    assert [p["name"] for p in rep["parts"]] == ["trainer", "inference"]
    assert all(p["state"] == "RUNNING" and p["nodes"] for p in rep["parts"])
    assert rep["attempt"] == 0 and rep["failed"] is None and rep["done"] is False

    # the text view: one line per het component, one per plan component
    r = slurm_cluster.slurmrl("status", str(run_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"job {rep['job_id']}: RUNNING")
    assert any(ln.split()[:4] == ["0", "trainer", f"{rep['job_id']}+0", "RUNNING"] for ln in lines), r.stdout
    trainer = next(ln.split() for ln in lines if ln.split()[:1] == ["trainer"] and "+0." in ln)
    header = next(ln.split() for ln in lines if ln.split()[:1] == ["component"])
    assert header[-2:] == ["ready", "restarts"], header
    assert trainer[3] == "RUNNING" and trainer[-2:] == ["1/1", "0"], trainer

    # by job id, and from inside the run dir with no argument
    by_id = slurm_cluster.slurmrl("status", rep["job_id"], cwd=tmp_path)
    assert by_id.returncode == 0 and str(run_dir) in by_id.stdout and "trainer" in by_id.stdout
    here = slurm_cluster.slurmrl("status", cwd=run_dir)
    assert here.returncode == 0 and here.stdout.splitlines()[0] == lines[0]

    # logs: every component's log of the latest attempt, each line prefixed by its file name
    r = slurm_cluster.slurmrl("logs", str(run_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "trainer.0.log: trainer: holding" in r.stdout
    assert any(ln.startswith("inference.0.log: {") for ln in r.stdout.splitlines())
    assert any(ln.startswith(f"batch-{rep['job_id']}.out: slurmrl: started trainer") for ln in r.stdout.splitlines())
    only = slurm_cluster.slurmrl("logs", str(run_dir), "--component", "inference", "--attempt", "0", cwd=tmp_path)
    assert only.stdout and all(ln.startswith("inference.0.log: ") for ln in only.stdout.splitlines())

    # logs -f follows until the job ends; cancel ends it and says how it ended
    follow = subprocess.Popen([sys.executable, "-m", "slurmrl", "logs", str(run_dir), "-f"], cwd=tmp_path,
                              env=slurm_cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = follow.stdout.readline()
        assert first.split(": ", 1)[0] in {f"batch-{rep['job_id']}.out", "inference.0.log", "orchestrator.0.log",
                                           "trainer.0.log"}
        started = time.monotonic()
        r = slurm_cluster.slurmrl("cancel", str(run_dir), cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.splitlines()[-1] == f"job {rep['job_id']}: CANCELLED"
        assert time.monotonic() - started < GRACE + 20
        out, err = follow.communicate(timeout=30)
    finally:
        follow.kill()
    assert follow.returncode == 0
    assert f"slurmrl: job {rep['job_id']} ended: CANCELLED" in err

    rep = status_json(slurm_cluster, run_dir)
    assert rep["state"] == "CANCELLED" and rep["done"] is True
    assert rep["failed"] is None  # a cancel is not the job's failure
    assert rep["stopped"].startswith("cancelled")
    assert "STOPPED: cancelled" in slurm_cluster.slurmrl("status", str(run_dir), cwd=tmp_path).stdout
    # the planned stop went in reverse start order: trainer and orchestrator before the servers
    batch = (run_dir / "logs" / f"batch-{rep['job_id']}.out").read_text()
    assert "in reverse start order" in batch
    r = slurm_cluster.slurmrl("cancel", str(run_dir), cwd=tmp_path)
    assert r.returncode == 0 and "had already ended: CANCELLED" in r.stdout


@pytest.mark.cluster
def test_a_failing_component_ends_the_job_and_status_names_it(slurm_cluster, job, tmp_path):
    run_dir = job(SLURMRL_TEST_FAIL="trainer")
    started = time.monotonic()
    r = slurm_cluster.slurmrl("status", str(run_dir), "--watch", cwd=tmp_path)
    took = time.monotonic() - started
    assert r.returncode == 1, r.stdout + r.stderr  # --watch: 0 only when the job completed
    assert took < GRACE + 25, took  # fail fast: TERM, GRACE seconds, KILL (plus start and sacct lag)
    final = ("\n" + r.stdout).rsplit("\njob ", 1)[-1]  # --watch prints a snapshot per change: the last one
    assert final.startswith(f"{json.loads((run_dir / 'jobs.json').read_text())[-1]['job_id']}: FAILED")
    assert "FAILED: trainer exited with code 3" in final
    rep = status_json(slurm_cluster, run_dir)
    comps = {c["name"]: c for c in rep["components"]}
    assert comps["trainer"]["step"]["state"] == "FAILED" and comps["trainer"]["step"]["exit_code"] == "3:0"
    assert comps["trainer"]["ready"] == []
    assert all(p["state"] == "FAILED" for p in rep["parts"])
    assert rep["failed"] == "trainer exited with code 3"
    # the other steps were stopped, none is left running, and status says the script stopped them
    assert all(c["step"] is None or c["step"]["state"] != "RUNNING" for c in rep["components"])
    assert not comps["trainer"]["torn_down"]
    others = [c for c in rep["components"] if c["name"] != "trainer" and c["step"] is not None]
    assert others and all(c["torn_down"] for c in others), rep["components"]
    for c in others:
        if c["step"]["state"] not in ("COMPLETED", "RUNNING"):
            assert re.search(rf"^\s*{re.escape(c['name'])} .*stopped by the script", final, re.M), final
    r = slurm_cluster.slurmrl("logs", str(run_dir), "--component", "trainer", cwd=tmp_path)
    assert "trainer.0.log: trainer: failing on purpose" in r.stdout


@pytest.mark.cluster
def test_warning_signal_stops_components_then_requeues(slurm_cluster, job, tmp_path):
    """What sbatch --signal=B:USR1@120 does before a time limit or a preemption: the script's trap
    TERMs every task (the real trainer checkpoints on TERM, see test_trainer.py), waits for them,
    then `scontrol requeue`s the job, which comes back as attempt 1."""
    run_dir = job(SLURMRL_TEST_HOLD="trainer")
    rep = wait_for(lambda: (r := status_json(slurm_cluster, run_dir))["state"] == "RUNNING"
                   and {c["name"]: c for c in r["components"]}["trainer"]["ready"] == [0] and r,
                   "the trainer to be up")
    job_id = rep["job_id"]
    sig = slurm_cluster.run(["scancel", "--batch", "--signal=USR1", job_id])
    assert sig.returncode == 0, sig.stderr

    def requeued():
        show = slurm_cluster.run(["scontrol", "show", "job", job_id]).stdout
        return "Restarts=1" in show and (run_dir / "logs" / "attempt-0" / "PREEMPTED").exists()

    wait_for(requeued, "the job to be requeued", timeout=90)
    batch = (run_dir / "logs" / f"batch-{job_id}.out").read_text()
    assert "got SIGUSR1: checkpoint and requeue" in batch and "stopping" in batch
    assert not (run_dir / "logs" / "attempt-0" / "FAILED").exists()


@pytest.mark.cluster
def test_a_requeued_job_waiting_in_the_queue_shows_its_next_attempt(slurm_cluster, job, tmp_path):
    """`status` showed attempt 0's end (and sacct's stale pending reason) while the job waited to
    run attempt 1; `scontrol requeuehold` keeps it waiting so the check cannot race the restart."""
    run_dir = job(SLURMRL_TEST_HOLD="trainer")
    rep = wait_for(lambda: (r := status_json(slurm_cluster, run_dir))["state"] == "RUNNING"
                   and {c["name"]: c for c in r["components"]}["trainer"]["ready"] == [0] and r,
                   "the trainer to be up")
    assert rep["attempt"] == 0 and not rep["attempt_waiting"]
    r = slurm_cluster.run(["scontrol", "requeuehold", rep["job_id"]])
    assert r.returncode == 0, r.stderr
    rep = wait_for(lambda: (r := status_json(slurm_cluster, run_dir))["state"] == "PENDING" and r,
                   "the job to wait in the queue", timeout=90)
    assert rep["attempt"] == 1 and rep["attempt_waiting"], rep
    assert rep["failed"] is None and rep["stopped"] is None and rep["phases"] == [] and rep["endpoints"] == []
    assert all(c["ready"] == [] for c in rep["components"])
    assert {p["reason"] for p in rep["parts"]} != {""}  # why it waits: held
    r = slurm_cluster.slurmrl("status", str(run_dir), cwd=tmp_path)
    assert "(attempt 1 waits in the queue" in r.stdout.splitlines()[0], r.stdout


def test_a_reason_is_shown_only_while_a_part_waits(monkeypatch):
    """sacct keeps the last pending reason (BeginTime) of a job that has run since."""
    from slurmrl.slurm import watch

    rows = {"State": "COMPLETED", "components": [
        {"JobID": "9+0", "group": 0, "State": "COMPLETED", "Reason": "BeginTime", "ExitCode": "0:0"},
        {"JobID": "9+1", "group": 1, "State": "PENDING", "Reason": "Priority", "ExitCode": "0:0"}], "steps": []}
    monkeypatch.setattr(watch, "squeue", lambda job_id: [])
    monkeypatch.setattr(watch.HetInfoWatcher, "get_info", lambda self, job_id, mode="standard": rows)
    snap = watch.Watch("9").snapshot()
    assert [p.reason for p in snap.parts] == ["", "Priority"]
    assert snap.restarts is None  # not asked: the controller does not know the job


@pytest.mark.cluster
def test_a_warning_before_the_job_is_up_does_not_requeue(slurm_cluster, job, tmp_path):
    """inference-debug with a 3-minute limit requeued itself forever: the warning came before vLLM
    was ready, every attempt. Now such a warning ends the job, saying why."""
    run_dir = job(SLURMRL_TEST_STALL="inference")
    job_id = json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]
    wait_for(lambda: (run_dir / "logs" / "attempt-0" / "inference.0.log").exists(), "the servers to start")
    sig = slurm_cluster.run(["scancel", "--batch", "--signal=USR1", job_id])
    assert sig.returncode == 0, sig.stderr
    failed = run_dir / "logs" / "attempt-0" / "FAILED"
    wait_for(failed.exists, "the job to fail")
    assert "warning signal before the job was up" in failed.read_text()
    time.sleep(3)
    assert "Restarts=0" in slurm_cluster.run(["scontrol", "show", "job", job_id]).stdout


@pytest.mark.cluster
def test_a_program_that_raises_says_why_in_one_line(slurm_cluster, job, tmp_path):
    """The orchestrator's environment raises: FAILED and `status` name the exception and where, not
    "orchestrator exited with code 1" (the step's guard read the traceback, its end record says it)."""
    program = tmp_path / "env.py"
    program.write_text("def reward(answers):\n    return 1 / len(answers)\n\n\nprint(reward([]))\n")
    run_dir = job(SLURMRL_TEST_RAISE="orchestrator", SLURMRL_TEST_PROGRAM=str(program))
    r = slurm_cluster.slurmrl("status", str(run_dir), "--watch", cwd=tmp_path, timeout=240)
    assert r.returncode == 1, r.stdout + r.stderr
    final = ("\n" + r.stdout).rsplit("\njob ", 1)[-1]
    assert "FAILED: orchestrator: ZeroDivisionError in env.py:2: division by zero" in final.splitlines(), final
    assert status_json(slurm_cluster, run_dir)["failed"] == "orchestrator: ZeroDivisionError in env.py:2: division by zero"
    assert "ZeroDivisionError: division by zero" in (run_dir / "logs" / "attempt-0" / "orchestrator.0.log").read_text()


@pytest.mark.cluster
def test_the_requeue_limit_ends_the_job_after_a_checkpoint(slurm_cluster, job, tmp_path):
    run_dir = job("slurm.max_requeues=0", SLURMRL_TEST_HOLD="trainer")
    rep = wait_for(lambda: (r := status_json(slurm_cluster, run_dir))["state"] == "RUNNING"
                   and {c["name"]: c for c in r["components"]}["trainer"]["ready"] == [0] and r,
                   "the trainer to be up", timeout=300)
    sig = slurm_cluster.run(["scancel", "--batch", "--signal=USR1", rep["job_id"]])
    assert sig.returncode == 0, sig.stderr
    preempted = run_dir / "logs" / "attempt-0" / "PREEMPTED"
    wait_for(preempted.exists, "the warning to be handled")
    assert "slurm.max_requeues" in preempted.read_text()
    # it stopped before its last step: never COMPLETED 0:0 (an afterok dependency would run), and
    # `status --watch` exits 1
    watch = slurm_cluster.slurmrl("status", str(run_dir), "--watch", cwd=tmp_path, timeout=120)
    assert watch.returncode == 1, watch.stdout + watch.stderr
    end = slurm_cluster.run(["sacct", "-X", "-n", "-P", "-o", "State,ExitCode", "-j", rep["job_id"]]).stdout.split()
    assert end[:1] == ["FAILED|75:0"], end
    assert "STOPPED: warning signal: stopped before the end, not requeued" in watch.stdout
    assert "Restarts=0" in slurm_cluster.run(["scontrol", "show", "job", rep["job_id"]]).stdout


@pytest.mark.cluster
def test_a_manual_requeue_reads_as_a_requeue_and_uses_none_of_the_jobs_own(slurm_cluster, job, tmp_path):
    """`scontrol requeue` read "cancel, time limit or preemption" and counted against
    slurm.max_requeues; now attempt 0's STOPPED says requeued, and with slurm.max_requeues=1 the job
    still requeues itself once after it (the warning signal in attempt 1)."""
    run_dir = job("slurm.max_requeues=1", SLURMRL_TEST_HOLD="trainer")
    up = (lambda attempt: lambda: (r := status_json(slurm_cluster, run_dir))["state"] == "RUNNING"
          and r["attempt"] == attempt and {c["name"]: c for c in r["components"]}["trainer"]["ready"] == [0] and r)
    rep = wait_for(up(0), "the trainer to be up")
    r = slurm_cluster.run(["scontrol", "requeue", rep["job_id"]])
    assert r.returncode == 0, r.stderr
    stopped = run_dir / "logs" / "attempt-0" / "STOPPED"
    wait_for(stopped.exists, "attempt 0 to stop", timeout=90)
    assert "requeued by Slurm" in stopped.read_text() and not (run_dir / "logs" / "attempt-0" / "FAILED").exists()
    rep = wait_for(up(1), "attempt 1 to be up", timeout=180)
    assert rep["requeues_used"] == 0
    assert "1 requeue(s) left" in slurm_cluster.slurmrl("status", str(run_dir), cwd=tmp_path).stdout.splitlines()[0]
    sig = slurm_cluster.run(["scancel", "--batch", "--signal=USR1", rep["job_id"]])
    assert sig.returncode == 0, sig.stderr
    preempted = run_dir / "logs" / "attempt-1" / "PREEMPTED"
    wait_for(preempted.exists, "the warning to be handled")
    assert "requeued as attempt 2" in preempted.read_text(), preempted.read_text()


def test_watch_into_a_log_reports_changes_not_clock_ticks():
    from slurmrl.app.status import without_elapsed

    a = {"state": "RUNNING", "parts": [{"id": "7+0", "elapsed": "00:00:01"}],
         "components": [{"step": {"elapsed": "00:00:01", "state": "RUNNING"}}]}
    b = {**a, "parts": [{"id": "7+0", "elapsed": "00:00:03"}],
         "components": [{"step": {"elapsed": "00:00:03", "state": "RUNNING"}}]}
    assert without_elapsed(a) == without_elapsed(b)
    assert without_elapsed(a) != without_elapsed({**b, "state": "COMPLETING"})


def test_a_ready_component_sacct_has_not_listed_reads_started():
    from slurmrl.app.status_report import ComponentStatus, PartStatus, StatusReport
    from slurmrl.app.status_text import text
    from slurmrl.slurm.watch import Part, Snapshot

    part = PartStatus(Part("7+0", 0, "RUNNING", "n1", "00:00:03"), "trainer")
    rep = StatusReport(Snapshot("7", "RUNNING"), "/r", [part], attempt=0,
                       components=[ComponentStatus("inference", 0, ready=[0]), ComponentStatus("trainer", 0)])
    rows = {ln.split()[0]: ln.split() for ln in text(rep).splitlines()[4:] if ln.strip()}
    assert rows["inference"][3] == "started" and rows["trainer"][3:5] == ["not", "started"]


def test_an_ended_het_job_is_asked_about_again(monkeypatch):
    """sacct can call a het job ended before it lists every component; submitit's watcher would
    never ask again about an ended job (CI lost group 1's nodes that way)."""
    import subprocess
    import time

    from slurmrl.slurm.watch import HetInfoWatcher

    header = "JobID|JobName|State|ExitCode|Elapsed|NodeList|Reason\n"
    answers = iter([header + "7+0|j|COMPLETED|0:0|00:00:05|n1|None\n",
                    header + "7+0|j|COMPLETED|0:0|00:00:05|n1|None\n7+1|j|COMPLETED|0:0|00:00:05|n[2-3]|None\n"])
    monkeypatch.setattr(subprocess, "check_output", lambda cmd, shell=False: next(answers).encode())  # sacct double
    watcher = HetInfoWatcher()
    assert [c["NodeList"] for c in watcher.get_info("7", mode="force")["components"]] == ["n1"]
    time.sleep(0.01)  # submitit ignores forced calls less than 1 ms apart
    assert [c["NodeList"] for c in watcher.get_info("7", mode="force")["components"]] == ["n1", "n[2-3]"]


def test_status_says_how_many_requeues_are_left():
    from slurmrl.app.status_report import StatusReport
    from slurmrl.app.status_text import text
    from slurmrl.slurm.watch import Snapshot

    rep = StatusReport(Snapshot("7", "RUNNING"), "/r", attempt=1, max_requeues=3)
    assert text(rep).splitlines()[0] == "job 7: RUNNING  (attempt 1, 2 requeue(s) left, run dir /r)"
