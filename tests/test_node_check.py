"""The node check's parts alone: the health probe with a stand-in nvidia-smi (a test double: this
machine has no GPU), and the notes the job script writes read back as events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from script_helper import run_helper

from slurmrl.contract import attempt_end, events
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.steps import attempts, probe_health

ROOT = Path(__file__).resolve().parent.parent


def fake_smi(tmp_path: Path, monkeypatch, body: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # test double: what nvidia-smi prints or does on a bad node
    smi.write_text(f"#!/bin/bash\n{body}\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


def test_on_a_cpu_node_the_gpu_parts_are_skipped_and_say_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    h = probe_health.probe(tmp_path)
    assert h.problems == [] and h.notes == ["GPU checks skipped: no nvidia-smi on this node (a CPU node)"]


@pytest.mark.parametrize(("body", "problem"), [
    ("echo 'Unable to determine the device handle for GPU0000:41:00.0: Unknown Error' >&2; exit 15",
     "nvidia-smi failed (exit 15): Unable to determine the device handle"),
    ("sleep 30", "nvidia-smi did not answer within 1s"),
    ("echo '0, NVIDIA H100'", "1 GPU(s) answer of the 2 Slurm gave this step (0,1)"),
])
def test_a_gpu_that_fails_hangs_or_is_missing_names_the_node_bad(tmp_path, monkeypatch, body, problem):
    fake_smi(tmp_path, monkeypatch, body)
    monkeypatch.setattr(probe_health, "GPU_QUERY_S", 1.0)
    monkeypatch.setenv("SLURM_STEP_GPUS", "0,1")
    h = probe_health.probe(tmp_path)
    assert len(h.problems) == 1 and h.problems[0].startswith(problem), h.problems


def test_every_gpu_answering_is_healthy(tmp_path, monkeypatch):
    fake_smi(tmp_path, monkeypatch, "echo '0, NVIDIA H100'; echo '1, NVIDIA H100'")
    monkeypatch.setenv("SLURM_STEP_GPUS", "0,1")
    assert probe_health.probe(tmp_path).problems == []


def test_an_unwritable_run_dir_is_a_problem(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    h = probe_health.probe(tmp_path / "gone")
    assert h.problems and h.problems[0].startswith(f"cannot write to {tmp_path / 'gone'}")


def test_the_scripts_notes_become_events_once(tmp_path):
    paths = RunDir(tmp_path)
    for a in (0, 1):
        paths.log_dir(a).mkdir(parents=True)
    paths.end_note(0).write_text("1765071000 node yes node(s) n2 failed; Slurm requeued the job\n")
    paths.node_faults(0).write_text("n2 Slurm: Not responding\nn2 Slurm: Not responding\n")
    paths.end_note(1).write_text("1765071300 application no an application failure is not requeued: trainer exited\n")
    new = attempts.record(tmp_path, "42", 1, current_done=True)
    assert [(e.kind, e.attempt, e.node) for e in new] == [("attempt_ended", 0, "n2"), ("excluded", 0, "n2"),
                                                          ("attempt_ended", 1, None)]
    assert attempts.record(tmp_path, "42", 1, current_done=True) == []  # once
    evs = events.read(paths.events)
    assert attempts.requeues_used(tmp_path, 2) == 1  # the node fault's
    assert attempts.excluded_nodes(tmp_path) == {"n2": "Slurm: Not responding"}
    assert [e.detail["class"] for e in attempt_end.ends(evs).values()] == ["node", "application"]


def test_a_note_that_is_not_one_is_skipped(tmp_path):
    paths = RunDir(tmp_path)
    paths.log_dir(0).mkdir(parents=True)
    paths.end_note(0).write_text("yesterday it broke\n")
    assert attempt_end.read_end(paths.end_note(0)) is None
    assert attempts.record(tmp_path, "7", 0, current_done=True) == []


# ---- the job script's side (RUN_DIR/slurmrl-functions.sh in bash, with Slurm's tools as test doubles) ----
def script_run(tmp_path: Path, body: str, squeue: str, sinfo: str = "", attempt: int = 1, ends: tuple = (),
               env: str = ""):
    """``body`` in the helper with doubles: squeue prints ``squeue``, sinfo ``sinfo``, scontrol logs its
    arguments to bin/scontrol.log (and shows job 42 with ExcNodeList=n9)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    doubles = {"sinfo": f"printf '%b' {sinfo!r}",
               "scontrol": 'echo "$*" >>"$(dirname "$0")/scontrol.log"\n'
                           '[[ $1 == show ]] && echo "JobId=42 JobName=x ExcNodeList=n9 NodeList=n[1-2]"; exit 0'}
    for name, text in doubles.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{text}\n")
        (bin_dir / name).chmod(0o755)
    for a, line in enumerate(ends):  # END notes of earlier attempts
        (tmp_path / "logs" / f"attempt-{a}").mkdir(parents=True)
        (tmp_path / "logs" / f"attempt-{a}" / "END").write_text(line + "\n")
    pre = f'SLURMRL_NODES_G0="n1 n2"\nJOB_IDS=42\nMAX_REQUEUES=2\nENVIRONMENT=BATCH\nUP=1\n{env}\n'
    r, log_dir = run_helper(tmp_path, pre + body, squeue, attempt=attempt)
    log = bin_dir / "scontrol.log"
    return r, log_dir, log.read_text() if log.exists() else ""


def test_slurm_ending_the_job_for_a_node_excludes_it_from_the_requeued_job(tmp_path):
    r, log_dir, calls = script_run(tmp_path, "on_term", 'echo "COMPLETING 2"', sinfo="n2 Not responding\n")
    assert r.returncode == 143, r.stderr
    assert (log_dir / "END").read_text().split()[1:3] == ["node", "yes"]
    assert (log_dir / "NODE_FAULTS").read_text() == "n2 Slurm: Not responding\n"
    assert "update jobid=42 ExcNodeList=n9,n2" in calls  # the job's own exclusions kept


def test_a_node_slurm_put_back_at_once_is_named_by_srun(tmp_path):
    """ReturnToService with its slurmd alive: sinfo no longer says; srun's words in the batch log do."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "batch-42.out").write_text("old\nsrun: error: Node failure on n2\n")
    r, log_dir, calls = script_run(tmp_path, 'BATCH_LOG="$RUN_DIR/logs/batch-42.out"\nBATCH_LOG_FROM=4\non_term',
                                   'echo "COMPLETING 2"')
    assert r.returncode == 143 and "ExcNodeList=n9,n2" in calls, r.stderr
    assert (log_dir / "NODE_FAULTS").read_text().startswith("n2 srun: node failure")


def test_a_failure_on_a_bad_node_requeues_without_it(tmp_path):
    r, log_dir, calls = script_run(tmp_path, 'abort "trainer exited with code 1"', 'echo "RUNNING 1"',
                                   sinfo="n2 gpu fell off the bus\n")
    assert r.returncode == 0, r.stderr
    # requeued first: Slurm refuses ExcNodeList on a running job ("Job is no longer pending execution")
    assert "requeue 42" in calls and calls.index("requeue 42") < calls.index("ExcNodeList=n9,n2"), calls
    assert (log_dir / "END").read_text().split(" ", 3)[1:] == [
        "node", "yes", "node(s) n2 bad (trainer exited with code 1); requeued as attempt 2 without them\n"]
    assert not (log_dir / "FAILED").exists()


def test_node_requeues_stop_at_slurm_max_requeues(tmp_path):
    r, log_dir, calls = script_run(tmp_path, 'abort "trainer exited with code 1"', 'echo "RUNNING 2"', attempt=2,
                                   sinfo="n2 down\n", ends=("1 node yes a", "2 node yes b"))
    assert r.returncode == 1 and "requeue 42" not in calls
    assert ("not requeued: requeued 2 time(s) already (the warning signal, node faults): slurm.max_requeues"
            in (log_dir / "END").read_text())


def test_the_warning_signals_requeues_and_node_faults_share_slurm_max_requeues(tmp_path):
    """One budget: a warning-signal requeue (attempt 0) and a node requeue (attempt 1) use both of 2."""
    body = 'echo "warning signal: requeued as attempt 1" >"$RUN_DIR/logs/attempt-0/PREEMPTED"\nabort "trainer exited"'
    r, log_dir, calls = script_run(tmp_path, body, 'echo "RUNNING 2"', attempt=2,
                                   sinfo="n2 down\n", ends=("1 preemption yes w", "2 node yes b"))
    assert r.returncode == 1 and "requeue 42" not in calls, r.stderr
    assert "requeued 2 time(s) already" in (log_dir / "END").read_text()


@pytest.mark.parametrize("said", ["srun: error: n2: task 0: Bus error (core dumped)",
                                  "srun: error: n2: task 1: Exited with exit code 135"])
def test_a_task_killed_by_sigbus_is_a_node_fault_requeued_without_the_node(tmp_path, said):
    """The kernel's hardware-error signal, in srun's words (the task itself, or 128+SIGBUS from the guard
    or a shell): the node is bad, the job requeues without it; sinfo says nothing (the node is up)."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "batch-42.out").write_text(f"old\n{said}\n")
    body = 'BATCH_LOG="$RUN_DIR/logs/batch-42.out"\nBATCH_LOG_FROM=4\nabort "trainer exited with code 135"'
    r, log_dir, calls = script_run(tmp_path, body, 'echo "RUNNING 1"')
    assert r.returncode == 0, r.stderr
    assert "requeue 42" in calls and "ExcNodeList=n9,n2" in calls
    assert (log_dir / "NODE_FAULTS").read_text().startswith("n2 srun: a task was killed by SIGBUS")
    assert (log_dir / "END").read_text().split(" ", 3)[1:3] == ["node", "yes"]


def test_only_node_names_from_the_faults_note_reach_scontrol(tmp_path):
    """A NODE_FAULTS line whose first word is not a host name (a host list, an '=' or ',' that would widen
    the update) is named on stderr and left out of the exclusion; the real node beside it is excluded."""
    (tmp_path / "logs" / "attempt-1").mkdir(parents=True)
    (tmp_path / "logs" / "attempt-1" / "NODE_FAULTS").write_text(
        "n[3-4] a host list\nn2,n3 two names\nExcNodeList=n1 x\n-n5 flag\nn2 real fault\n")
    r, log_dir, calls = script_run(tmp_path, 'abort "trainer exited with code 1"', 'echo "RUNNING 1"')
    assert r.returncode == 0, r.stderr
    assert "update jobid=42 ExcNodeList=n9,n2\n" in calls, calls
    for bad in ("n[3-4]", "n2,n3", "ExcNodeList=n1", "-n5"):
        assert f"NODE_FAULTS names '{bad}', not a node name" in r.stderr


def test_an_application_failure_is_not_requeued(tmp_path):
    r, log_dir, calls = script_run(tmp_path, 'abort "orchestrator exited with code 3"', 'echo "RUNNING 0"')
    assert r.returncode == 1 and "requeue" not in calls
    assert (log_dir / "END").read_text().split(" ", 3)[1:] == [
        "application", "no", "an application failure is not requeued: orchestrator exited with code 3\n"]


@pytest.mark.parametrize(("env", "cls"), [("", "cancel"), ("SLURMRL_JOB_END=$(date +%s)", "time_limit")])
def test_slurm_ending_the_job_otherwise_is_a_cancel_or_the_time_limit(tmp_path, env, cls):
    r, log_dir, _ = script_run(tmp_path, "on_term", 'echo "COMPLETING 1"', env=env)
    assert r.returncode == 143 and (log_dir / "END").read_text().split()[1:3] == [cls, "no"], r.stderr


# ---- the all-reduce across the step's nodes (real torch, gloo on the CPU; two ranks as two processes) ----
def allreduce_rank(tmp_path: Path, rank: int, world: int, node: str, timeout: float = 60) -> subprocess.Popen:
    (tmp_path / "logs" / "attempt-0").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SLURMRL_RUN_DIR": str(tmp_path), "SLURMRL_ATTEMPT": "0", "SLURM_PROCID": str(rank),
           "SLURM_STEP_NUM_TASKS": str(world), "SLURMD_NODENAME": node, "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0",
           "SLURM_STEP_NODELIST": "localhost,n-late", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "slurmrl.runtime.steps.probe_allreduce", "--timeout", str(timeout)],
                            env=env, stdout=subprocess.PIPE, text=True)


def report(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    return json.loads(out.strip().splitlines()[-1])


def test_every_node_joining_sums_right(tmp_path):
    ranks = [allreduce_rank(tmp_path, r, 2, "localhost") for r in (0, 1)]
    got = [report(p) for p in ranks]
    assert all(g["faults"] == {} for g in got), got
    assert all(g["notes"][0].startswith("all-reduce over 2 node(s) ok (gloo, ") for g in got), got
    print(f"all-reduce probe, two ranks, torch import included: {max(g['seconds'] for g in got):.1f} s")


def test_a_node_that_does_not_join_is_named_bad_by_rank_0(tmp_path):
    got = report(allreduce_rank(tmp_path, 0, 2, "localhost", timeout=3))
    assert got["faults"] == {"n-late": "did not join the node check's all-reduce within 3s"}, got


def test_no_rank_0_names_rank_0s_node(tmp_path):
    got = report(allreduce_rank(tmp_path, 1, 2, "n-late", timeout=2))
    assert got["faults"] == {"localhost": "did not host the node check's all-reduce within 2s (seen from n-late)"}, got


def test_the_node_check_names_the_node_the_all_reduce_names_and_skips_one_node(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")
    assert "all-reduce skipped: one node in this step" in probe_health.probe(tmp_path, "n1", False,
                                                                             probe_health.AllReduce()).notes
    for k, v in {"SLURMRL_RUN_DIR": str(tmp_path), "SLURMRL_ATTEMPT": "0", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2",
                 "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "1", "SLURM_STEP_NODELIST": "localhost,n-late",
                 "PYTHONPATH": str(ROOT)}.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "logs" / "attempt-0").mkdir(parents=True)
    h = probe_health.probe(tmp_path / "logs" / "attempt-0", "localhost", False, probe_health.AllReduce(2))
    assert h.problems == [] and h.others == {"n-late": "did not join the node check's all-reduce within 2s"}, h


def test_without_torch_the_all_reduce_is_skipped_and_says_so(tmp_path):
    (tmp_path / "torch").mkdir()  # a package named torch that cannot be imported: as a Python without torch
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('No module named torch (test)')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    r = subprocess.run([sys.executable, "-m", "slurmrl.runtime.steps.probe_allreduce"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 5 and json.loads(r.stdout)["notes"][0].startswith("all-reduce skipped: torch cannot be imported")


def test_a_container_that_did_not_start_on_a_node_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("SLURMRL_PYXIS_TEST_DOUBLE", "1")
    assert "container check skipped: the Pyxis test double runs no image" in probe_health.probe(
        tmp_path, in_container=True).notes[-1]
    monkeypatch.delenv("SLURMRL_PYXIS_TEST_DOUBLE")
    h = probe_health.probe(tmp_path, in_container=True)  # this machine runs no enroot container
    assert h.problems == ["the job asks for a container, but this node ran the check outside one (no enroot /.lock)"]


def test_a_node_where_the_check_never_started_is_named_when_it_started_elsewhere(tmp_path):
    logs = tmp_path / "logs" / "attempt-1"
    logs.mkdir(parents=True)
    (logs / "nodes.g0.0.log").write_text("n1: cleanup: nothing left by earlier jobs\nn1: health: ok\n")
    (logs / "nodes.g0.1.log").write_text("pyxis: child 4242 failed with error code: 1\n")
    r, log_dir, calls = script_run(tmp_path, 'nodes_failed "node check, group 0" 0', 'echo "RUNNING 1"')
    assert r.returncode == 0 and "requeue 42" in calls, r.stderr
    assert (log_dir / "NODE_FAULTS").read_text().startswith("n2 the node check did not start there")
