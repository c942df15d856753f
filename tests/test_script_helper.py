"""The helper file job.sbatch sources (RUN_DIR/slurmrl-functions.sh), run in bash: the requeue
decision reads what job.sbatch sets (MAX_REQUEUES empty: requeue off; MAX_TOTAL_SECONDS) and counts
only the job's own requeues, and a helper of another version refuses to load."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from script_helper import HELPER, run_helper

from slurmrl.app.build import build

ROOT = Path(__file__).resolve().parent.parent


def refusal(tmp_path: Path, own: int = 0, **env: str) -> str:
    """requeue_refusal's answer; ``own``: attempts the job requeued itself (their PREEMPTED notes)."""
    (tmp_path / "logs" / "attempt-0").mkdir(parents=True, exist_ok=True)
    (tmp_path / "logs" / "attempt-0" / "phases").write_text("1000 allocation\n")
    for a in range(own):
        (tmp_path / "logs" / f"attempt-{a}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "logs" / f"attempt-{a}" / "PREEMPTED").write_text(f"warning signal: requeued as attempt {a + 1}\n")
    (tmp_path / "f.sh").write_text(HELPER)
    sets = "".join(f"{k}={v!r}\n" for k, v in env.items())
    body = f'RUN_DIR={str(tmp_path)!r}\nsource "$RUN_DIR/f.sh" 2\n{sets}requeue_refusal\necho "[$REFUSAL]"\n'
    r = subprocess.run(["bash", "-c", body], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.parametrize(("env", "expected"), [
    ({"MAX_REQUEUES": "", "ENVIRONMENT": "BATCH", "UP": "1", "ATTEMPT": "0"}, "[slurm.requeue is off]"),
    ({"MAX_REQUEUES": "3", "UP": "1", "ATTEMPT": "0"}, "[not a batch job (bash job.sbatch inside salloc)]"),
    ({"MAX_REQUEUES": "3", "ENVIRONMENT": "BATCH", "UP": "0", "ATTEMPT": "0"},
     "[it came before every component was ready; another attempt would start over the same way]"),
    ({"own": 2, "MAX_REQUEUES": "2", "ENVIRONMENT": "BATCH", "UP": "1", "ATTEMPT": "2"},
     "[requeued 2 time(s) already: slurm.max_requeues]"),
    # two manual `scontrol requeue`s (attempt 2, no PREEMPTED note of the job's own) use no requeue
    ({"MAX_REQUEUES": "2", "ENVIRONMENT": "BATCH", "UP": "1", "ATTEMPT": "2"}, "[]"),
    ({"own": 1, "MAX_REQUEUES": "2", "ENVIRONMENT": "BATCH", "UP": "1", "ATTEMPT": "3"}, "[]"),
    ({"MAX_REQUEUES": "3", "ENVIRONMENT": "BATCH", "UP": "1", "ATTEMPT": "1"}, "[]"),
    ({"MAX_REQUEUES": "3", "ENVIRONMENT": "BATCH", "UP": "1", "ATTEMPT": "1", "MAX_TOTAL_SECONDS": "60"},
     "[the job has run 60 s over all attempts: slurm.max_total_time]"),
    ({"MAX_REQUEUES": "3", "ENVIRONMENT": "BATCH", "UP": "1", "ATTEMPT": "1", "MAX_TOTAL_SECONDS": "99999999999"}, "[]"),
])
def test_requeue_refusal_reads_what_the_script_sets(tmp_path, env, expected):
    assert refusal(tmp_path, **env) == expected


def test_the_script_sets_what_the_requeue_decision_reads(tmp_path):
    recipe = ROOT / "recipes" / "rl-debug.toml"
    off = build(recipe, ["slurm.requeue=false"], run_dir=tmp_path / "a").script
    assert re.search(r'^MAX_REQUEUES="" ', off, re.M) and "MAX_TOTAL_SECONDS" not in off
    capped = build(recipe, ['slurm.max_total_time="3-00:00:00"', "slurm.max_requeues=5"], run_dir=tmp_path / "b").script
    assert re.search(r"^MAX_REQUEUES=5 ", capped, re.M) and re.search(r"^MAX_TOTAL_SECONDS=259200 ", capped, re.M)
    assert re.search(r"^WARN_SIGNAL=USR1 ", capped, re.M)


def test_a_helper_of_another_version_refuses_to_load(tmp_path):
    (tmp_path / "f.sh").write_text(HELPER)
    r = subprocess.run(["bash", "-c", f'set -e\nsource {str(tmp_path / "f.sh")!r} 1\necho loaded'],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "loaded" not in r.stdout
    assert r.stderr.strip() == "slurmrl: job.sbatch asks for slurmrl-functions.sh version 1; this is version 2"


@pytest.mark.parametrize(("squeue", "ending"), [
    ('echo "RUNNING 0"', ""),
    ('echo "SIGNALING 0"', ""),
    ('echo "COMPLETING 0"', "ended"),  # scancel, the time limit: the controller shows the job completing
    ('echo "CANCELLED 0"', "ended"),
    ('echo "COMPLETING 1"', "requeued"),  # scontrol requeue counts a restart at once
    ('echo "PENDING 1"', "requeued"),
    ("", "ended"),  # no longer listed
    ('echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1', "ended"),
    ('echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1', ""),  # cannot say
])
def test_slurm_ending_reads_the_controller(tmp_path, squeue, ending):
    r, _ = run_helper(tmp_path, 'slurm_ending\necho "[${ENDING}]"', squeue)
    assert r.returncode == 0 and r.stdout.strip() == f"[{ending}]", r.stderr


@pytest.mark.parametrize(("squeue", "code", "note", "text"), [
    # inside salloc, `slurmrl cancel` ends the steps and sends the shell nothing: a stop, not a failure
    ('echo "COMPLETING 0"', 143, "STOPPED", "router ended with code 143 as Slurm ended the job (cancel, time limit or"),
    ('echo "COMPLETING 1"', 143, "STOPPED", "(requeued by Slurm (scontrol requeue, or a preemption that requeues): "
                                            "attempt 1 follows)"),
    ('echo "RUNNING 0"', 1, "FAILED", "router exited with code 143"),  # the job runs on: the router failed
])
def test_a_step_that_ends_as_slurm_ends_the_job_is_a_stop(tmp_path, squeue, code, note, text):
    body = "launch router bash -c 'exit 143'\nsupervise trainer"
    r, log_dir = run_helper(tmp_path, body, squeue)
    assert r.returncode == code, r.stdout + r.stderr
    assert text in (log_dir / note).read_text()
    assert not (log_dir / ("FAILED" if note == "STOPPED" else "STOPPED")).exists()


def test_a_step_that_ends_before_it_is_ready_as_slurm_ends_the_job_is_a_stop(tmp_path):
    body = "launch router bash -c 'exit 143'\nsleep 0.2\nstill_starting router 60 $((SECONDS + 60)) 'x'"
    r, log_dir = run_helper(tmp_path, body, 'echo "COMPLETING 0"')
    assert r.returncode == 143 and "router ended before it was ready as Slurm ended" in (log_dir / "STOPPED").read_text()


@pytest.mark.parametrize(("squeue", "text"), [
    ('echo "COMPLETING 0"', "got SIGTERM from Slurm (cancel, time limit or preemption)"),
    ('echo "COMPLETING 2"', "got SIGTERM from Slurm (requeued by Slurm (scontrol requeue, or a preemption that "
                            "requeues): attempt 2 follows)"),
])
def test_on_term_says_a_manual_requeue_is_a_requeue(tmp_path, squeue, text):
    r, log_dir = run_helper(tmp_path, "on_term", squeue, attempt=1)
    assert r.returncode == 143 and (log_dir / "STOPPED").read_text().strip() == text, r.stderr


@pytest.mark.parametrize(("squeue", "code", "note"), [('echo "COMPLETING 0"', 143, "STOPPED"),
                                                      ('echo "RUNNING 0"', 1, "FAILED")])
def test_an_abort_while_slurm_ends_the_job_is_a_stop(tmp_path, squeue, code, note):
    """Every other path to abort (a staging or port-claim srun Slurm ended) reads the same way."""
    r, log_dir = run_helper(tmp_path, 'abort "model staging failed"', squeue)
    assert r.returncode == code, r.stdout + r.stderr
    assert (log_dir / note).read_text().startswith("model staging failed")


@pytest.mark.parametrize("pause", ["", "sleep 0.5"])
def test_a_step_that_ended_before_supervise_is_still_its_failure(tmp_path, pause):
    """bash 5.2's `wait -n` no longer knows a child that ended earlier: supervise collects it by pid."""
    r, log_dir = run_helper(tmp_path, f"launch router bash -c 'exit 3'\n{pause}\nsupervise trainer", 'echo "RUNNING 0"')
    assert r.returncode == 1, r.stdout + r.stderr
    assert (log_dir / "FAILED").read_text().strip() == "router exited with code 3"
    assert "unbound" not in r.stderr and "no such job" not in r.stderr


def test_a_main_step_that_ended_before_supervise_is_a_success(tmp_path):
    r, _ = run_helper(tmp_path, "launch trainer true\nsleep 0.5\nsupervise trainer", 'echo "RUNNING 0"')
    assert r.returncode == 0 and "trainer finished" in r.stdout, r.stdout + r.stderr


# ---- the task that failed first is the one named (its end record, slurmrl.rundir.ended) ----------------
def end_record(log_dir: Path, name: str, line: str) -> None:
    (log_dir / "ended").mkdir(parents=True, exist_ok=True)
    (log_dir / "ended" / name).write_text(line + "\n")


@pytest.mark.parametrize(("records", "failed"), [
    # a killed server, then the orchestrator that lost it: the server is named, not the orchestrator
    ({"inference.3": "1795634147766291363 137 failed 6 exited with code 137 (SIGKILL)",
      "orchestrator.0": "1795634147766291364 1 failed 1 VLLMError in loop.py:80: connection refused"},
     "inference.3 exited with code 137 (SIGKILL)"),
    ({"orchestrator.0": "200 1 failed 1 ZeroDivisionError in env.py:36: division by zero",
      "trainer.0": "300 143 stopped 1", "inference.0": "50 143 stopped 1"},
     "orchestrator: ZeroDivisionError in env.py:36: division by zero"),
    ({"orchestrator.0": "200 1 failed 1"}, "orchestrator exited with code 1"),
    ({"trainer.0": "100 0 finished 1"}, "router exited with code 3"),  # nothing failed: what the script saw
    ({}, "router exited with code 3"),
    ({"router.0": "oops", "x.y": "1 1 failed 1 bad name", "trainer.0": "1 1 failed x bad count", "judge.0": "9999999999999999999999 1 failed 1 huge"},
     "router exited with code 3"),  # what is not a record is passed over, not a crash
])
def test_abort_names_the_task_that_failed_first(tmp_path, records, failed):
    _, log_dir = run_helper(tmp_path, "true", 'echo "RUNNING 0"')
    for name, line in records.items():
        end_record(log_dir, name, line)
    r, log_dir = run_helper(tmp_path, "launch router bash -c 'exit 3'\nsupervise trainer", 'echo "RUNNING 0"')
    assert r.returncode == 1, r.stdout + r.stderr
    assert (log_dir / "FAILED").read_text().strip() == failed
    assert "unbound" not in r.stderr


def test_a_dead_replica_of_a_step_that_serves_on_is_not_blamed_for_what_fails_later(tmp_path):
    """A replicas job serves on when one server dies (srun --kill-on-bad-exit=0): when the router fails
    later, the router is named; once the servers' whole step has ended, its first dead server is."""
    _, log_dir = run_helper(tmp_path, "true", 'echo "RUNNING 0"')
    end_record(log_dir, "inference.2", "100 0 failed 4 vLLM's engine process died")
    end_record(log_dir, "router.0", "200 1 failed 1 exited with code 1")
    body = ("launch inference bash -c 'sleep 30' --kill-on-bad-exit=0\n"
            "launch router bash -c 'exit 1'\nsupervise inference")
    r, log_dir = run_helper(tmp_path, body, 'echo "RUNNING 0"')
    assert r.returncode == 1 and (log_dir / "FAILED").read_text().strip() == "router exited with code 1", r.stderr
    body = "launch inference bash -c 'exit 1' --kill-on-bad-exit=0\nsupervise inference"
    r, log_dir = run_helper(tmp_path, body, 'echo "RUNNING 0"')
    assert (log_dir / "FAILED").read_text().strip() == "inference.2: vLLM's engine process died", r.stderr


def test_an_rl_jobs_servers_that_all_ended_are_logged_and_the_job_goes_on(tmp_path):
    """launch --orchestrated (an RL job's servers): their step's end is a phase naming each task's cause,
    not the job's end; the orchestrator, not a dead server, is named when the job then fails."""
    _, log_dir = run_helper(tmp_path, "true", 'echo "RUNNING 0"')
    end_record(log_dir, "inference.1", "100 137 failed 2 exited with code 137 (SIGKILL)")
    body = ("launch --orchestrated inference bash -c 'exit 137' --kill-on-bad-exit=0\n"
            "launch trainer bash -c 'sleep 1'\nsupervise trainer")
    r, log_dir = run_helper(tmp_path, body, 'echo "RUNNING 0"')
    assert r.returncode == 0 and "trainer finished" in r.stdout, r.stdout + r.stderr
    phases = (log_dir / "phases").read_text()
    assert "inference: every task has ended (srun code 137; inference.1 exited with code 137 (SIGKILL))" in phases
    assert not (log_dir / "FAILED").exists()
    end_record(log_dir, "orchestrator.0", "200 1 failed 1 RuntimeError in loop.py:9: 0 servers alive, min_servers 1")
    body = ("launch --orchestrated inference bash -c 'exit 137' --kill-on-bad-exit=0\n"
            "launch orchestrator bash -c 'sleep 1; exit 1'\nsupervise orchestrator")
    r, log_dir = run_helper(tmp_path, body, 'echo "RUNNING 0"')
    assert r.returncode == 1, r.stdout + r.stderr
    assert (log_dir / "FAILED").read_text().strip() == "orchestrator: RuntimeError in loop.py:9: 0 servers alive, min_servers 1"


def test_a_noncritical_component_that_died_earlier_is_never_the_cause(tmp_path):
    """critical = false (the collector): its earlier death was logged; the failure that ends the job is named."""
    _, log_dir = run_helper(tmp_path, "true", 'echo "RUNNING 0"')
    end_record(log_dir, "collector.0", "100 137 failed 1 exited with code 137 (SIGKILL)")
    end_record(log_dir, "orchestrator.0", "200 1 failed 1 ZeroDivisionError in env.py:36: division by zero")
    r, log_dir = run_helper(tmp_path, "NONCRITICAL=(collector)\nlaunch orchestrator bash -c 'exit 1'\nsupervise trainer",
                            'echo "RUNNING 0"')
    assert r.returncode == 1, r.stdout + r.stderr
    assert (log_dir / "FAILED").read_text().strip() == "orchestrator: ZeroDivisionError in env.py:36: division by zero"

@pytest.mark.parametrize(("env", "code", "note"), [
    # out of requeues, or requeue off: the run stopped before its end; never 0 (COMPLETED, afterok)
    ({"MAX_REQUEUES": "0", "ENVIRONMENT": "BATCH", "UP": "1"}, 75, "stopped before the end, not requeued: requeued 0"),
    ({"MAX_REQUEUES": "", "ENVIRONMENT": "BATCH", "UP": "1"}, 75, "stopped before the end, not requeued: slurm.requeue is off"),
    ({"MAX_REQUEUES": "3", "ENVIRONMENT": "BATCH", "UP": "0"}, 1, "it came before every component was ready"),
])
def test_a_warning_that_does_not_requeue_never_exits_0(tmp_path, env, code, note):
    sets = "".join(f"{k}={v!r}\n" for k, v in env.items())
    (tmp_path / "logs" / "attempt-0").mkdir(parents=True)
    (tmp_path / "logs" / "attempt-0" / "phases").write_text("1000 allocation\n")
    r, log_dir = run_helper(tmp_path, f"{sets}on_warning", 'echo "RUNNING 0"')
    assert r.returncode == code, r.stdout + r.stderr
    assert note in (log_dir / "PREEMPTED").read_text()


def test_a_new_run_of_an_attempt_starts_without_the_last_runs_end_records(tmp_path):
    """Inside salloc, `bash job.sbatch` again runs the same attempt: a failure recorded by the last run
    must not be blamed for this one's."""
    _, log_dir = run_helper(tmp_path, "true", 'echo "RUNNING 0"')
    end_record(log_dir, "orchestrator.0", "100 1 failed 1 ZeroDivisionError in env.py:2")
    body = f'READY_DIR={str(tmp_path / "ready")!r}\nENVIRONMENT=BATCH\nbegin_attempt\nls "$LOG_DIR"'
    r, log_dir = run_helper(tmp_path, body, 'echo "RUNNING 0"')
    assert r.returncode == 0 and not (log_dir / "ended").exists(), r.stdout + r.stderr
