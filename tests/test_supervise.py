"""The task supervisor with real processes: exit codes, ready files, GPU slices, and no process
left behind whichever level of the tree is killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
from supervised_processes import free_port, gone, start, wait_for

from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import read_ready

ROOT = Path(__file__).resolve().parent.parent


def tree_with_grandchild(tmp_path: Path) -> list[str]:
    """A command whose child outlives it unless someone ends it: bash that starts `sleep` and waits."""
    return ["bash", "-c", f'sleep 300 & echo $! >{tmp_path}/grandchild; wait']


def test_exit_code_and_leftovers_ended(tmp_path):
    p = start(tmp_path, "x", "--", "bash", "-c", f"sleep 300 & echo $! >{tmp_path}/grandchild; exit 3")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 3, out
    assert gone(int((tmp_path / "grandchild").read_text()))
    assert "exec: bash -c" in out and "left behind" in out


@pytest.mark.parametrize("victim", ["supervisor", "guard", "command", "grandchild"])
def test_sigkill_at_any_level_leaves_nothing(tmp_path, victim):
    p = start(tmp_path, "x", "--", *tree_with_grandchild(tmp_path))
    grandchild = wait_for(lambda: (tmp_path / "grandchild").exists() and (tmp_path / "grandchild").read_text().strip())
    grandchild = int(grandchild)
    sup = psutil.Process(p.pid)
    guard = sup.children()[0]
    command = guard.children()[0]
    assert "slurmrl.runtime.steps.guard" in " ".join(guard.cmdline()) and command.cmdline()[0] == "bash"
    pid = {"supervisor": p.pid, "guard": guard.pid, "command": command.pid, "grandchild": grandchild}[victim]
    os.kill(pid, signal.SIGKILL)
    p.wait(timeout=60)
    for proc in (guard.pid, command.pid, grandchild):
        wait_for(lambda proc=proc: gone(proc), timeout=30)


def test_term_reaches_the_command_and_gives_its_code(tmp_path):
    p = start(tmp_path, "x", "--", sys.executable, "-c",
              "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(7)); print('up', flush=True); time.sleep(60)")
    wait_for(lambda: len(psutil.Process(p.pid).children(recursive=True)) >= 2)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 7, out


def test_ready_file_has_url_task_count_and_the_servers_pid(tmp_path):
    port = free_port()
    p = start(tmp_path, "srv", "--ready", f"http://127.0.0.1:{port}", "--",
              sys.executable, str(ROOT / "tests" / "support" / "ok_server.py"), str(port), env={"SLURM_STEP_NUM_TASKS": "3"})
    try:
        f = RunDir(tmp_path).ready_file(0, "srv", 0)
        wait_for(f.exists)
        url, ntasks, pid = read_ready(f)
        assert (url, ntasks) == (f"http://127.0.0.1:{port}", 3)
        assert "ok_server.py" in " ".join(psutil.Process(pid).cmdline())
    finally:
        p.terminate()
        p.communicate(timeout=30)


def test_gpu_slice_is_what_the_command_sees(tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    p = start(tmp_path, "x", "--gpus", "1:2", "--", "bash", "-c", 'echo "seen=$CUDA_VISIBLE_DEVICES"', env=env)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0 and "seen=5,6" in out
    p = start(tmp_path, "x", "--gpus", "3:2", "--", "true", env=env)
    out, _ = p.communicate(timeout=30)
    assert p.returncode != 0 and "GPU positions 3..4" in out and "4,5,6,7" in out


@pytest.mark.parametrize("args", [["x"], ["x", "--"], ["x", "--gpus", "a", "--", "true"], ["x", "--ready", "ftp://h:1", "--", "true"]])
def test_bad_arguments_say_so(tmp_path, args):
    p = start(tmp_path, *args)
    out, _ = p.communicate(timeout=30)
    assert p.returncode != 0 and "Traceback" not in out, out


BEATING = ("import time\nfrom slurmrl import heartbeat\nwhile True:\n    heartbeat.beat(0.1)\n    time.sleep(0.2)\n")


def test_a_command_that_stops_beating_is_ended_with_124(tmp_path):
    p = start(tmp_path, "orchestrator", "--heartbeat", "2", "--", sys.executable, "-c", BEATING,
              env={"PYTHONPATH": str(ROOT)})
    beat_file = RunDir(tmp_path).heartbeat_file(0, "orchestrator", 0)
    wait_for(beat_file.exists)
    time.sleep(3)
    assert p.poll() is None  # beating: left alone
    command = psutil.Process(p.pid).children()[0].children()[0]
    command.suspend()  # SIGSTOP: hung
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 124, out
    assert "no heartbeat for" in out and "hung" in out
    wait_for(lambda: gone(command.pid))


def test_no_heartbeat_file_no_watch(tmp_path):
    """Model loading before the first beat does not count."""
    p = start(tmp_path, "trainer", "--heartbeat", "1", "--", "sleep", "3")
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0, out
