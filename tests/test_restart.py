"""Restart in place, without Slurm: the backoff schedule, and the supervisor's restart loop around a real
local server (python's http.server on a free port) that is killed with SIGKILL: relaunched on the same
port, ready again (its ready file, its new pid), what the dead one left behind ended, every death and
restart in RUN_DIR/events.jsonl, and the task's end once no restart is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tomllib

import psutil
import pytest
from supervised_processes import free_port, gone, start, wait_for

from slurmrl.contract import events
from slurmrl.contract.argv import Supervise
from slurmrl.contract.restart_policy import BACKOFF_CAP_S, Policy
from slurmrl.rundir import ended
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import read_ready


def test_the_backoff_doubles_from_the_first_restart_and_stops_at_the_cap():
    assert [Policy("on-failure", 10, 10).delay(n) for n in range(1, 8)] == [10, 20, 40, 80, 160, BACKOFF_CAP_S, 300]
    assert Policy("always", 3, 0).delay(5) == 0
    assert Policy("always", 3, 600).delay(3) == 600  # a backoff above the cap is the user's: never shortened
    with pytest.raises(ValueError):
        Policy("on-failure").delay(0)


@pytest.mark.parametrize(("mode", "code", "asked", "done", "want"), [
    ("never", 137, False, 0, False),
    ("on-failure", 137, False, 0, True),
    ("on-failure", 0, False, 0, False),
    ("on-failure", 1, False, 2, False),  # max_restarts = 2 reached
    ("always", 0, False, 1, True),
    ("always", 137, True, 0, False),  # a stop the supervisor passed on: never restarted
])
def test_which_ends_are_restarted(mode, code, asked, done, want):
    assert Policy(mode, 2, 1).wants(code, asked, done) is want


def test_a_bad_policy_is_refused_in_one_line():
    with pytest.raises(ValueError, match="restart 'sometimes'"):
        Policy("sometimes")
    assert Supervise("x").restart_policy() is None
    words = Supervise("x", restart="on-failure", max_restarts=2, restart_backoff=0, command=("a",)).to_argv()
    assert Supervise.parse(words).restart_policy() == Policy("on-failure", 2, 0)


def server(tmp_path, port: int, *policy: str) -> subprocess.Popen:
    """A supervised http.server that starts a grandchild (`sleep`) the supervisor must end after a death."""
    command = f"sleep 300 & echo $! >>{tmp_path}/grandchildren; exec {sys.executable} -m http.server {port} --bind 127.0.0.1"
    return start(tmp_path, "inference", "--ready", f"tcp://127.0.0.1:{port}", *policy, "--", "bash", "-c", command,
                 env={"SLURM_JOB_ID": "77"})


def ready_pid(tmp_path, not_pid: int | None = None) -> int:
    path = RunDir(tmp_path).ready_file(0, "inference", 0)

    def found():
        if not path.exists():
            return None
        _, _, pid = read_ready(path)
        return pid if pid and pid != not_pid else None
    return wait_for(found, timeout=60)


def kinds(tmp_path) -> list[str]:
    return [e.kind for e in events.read(RunDir(tmp_path).events)]


def test_a_killed_server_is_restarted_in_place_until_no_restart_is_left(tmp_path):
    port = free_port()
    (tmp_path / "lock.toml").write_text('[lock]\nformat = 1\n')
    p = server(tmp_path, port, "--restart", "on-failure", "--max-restarts", "1", "--restart-backoff", "0")
    try:
        first = ready_pid(tmp_path)
        os.kill(first, signal.SIGKILL)
        second = ready_pid(tmp_path, not_pid=first)  # ready again: a new pid, its ready file rewritten
        assert str(port) in psutil.Process(second).cmdline()  # the same port, the same command
        grandchildren = [int(x) for x in (tmp_path / "grandchildren").read_text().split()]
        assert len(grandchildren) == 2 and gone(grandchildren[0]) and not gone(grandchildren[1])
        assert kinds(tmp_path) == ["died", "restarted"]
        died, restarted = events.read(RunDir(tmp_path).events)
        assert "SIGKILL" in died.cause and died.component == "inference" and died.task == 0
        assert died.attempt == 0 and died.job_id == "77" and restarted.detail["restarts"] == 1
        os.kill(second, signal.SIGKILL)  # no restart left: the task ends, recorded as dead
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 137, out
        assert kinds(tmp_path) == ["died", "restarted", "died", "dead"]
        dead = events.read(RunDir(tmp_path).events)[-1]
        assert "max_restarts = 1" in dead.detail["why"] and dead.detail["restarts"] == 1
        rec = ended.read_ended(RunDir(tmp_path).ended_file(0, "inference", 0))
        assert rec is not None and rec.failed and "SIGKILL" in rec.cause
        assert gone(grandchildren[1])
        # lock.toml says the result was produced through a restart and a death
        lock = tomllib.loads((tmp_path / "lock.toml").read_text())["lock"]
        assert [(x["kind"], x["component"], x["task"], x["job_id"]) for x in lock["restarts"]] == [
            ("restarted", "inference", 0, "77"), ("dead", "inference", 0, "77")]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_stop_during_the_backoff_ends_the_task_without_a_restart(tmp_path):
    port = free_port()
    p = server(tmp_path, port, "--restart", "always", "--restart-backoff", "300")
    try:
        os.kill(ready_pid(tmp_path), signal.SIGKILL)
        wait_for(lambda: kinds(tmp_path) == ["died"])
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=60)  # not after 300 s: the stop ends the backoff
        assert kinds(tmp_path) == ["died"], out
        rec = ended.read_ended(RunDir(tmp_path).ended_file(0, "inference", 0))
        assert rec is not None and rec.state == "stopped"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_restart_never_records_the_death_and_ends_the_task(tmp_path):
    port = free_port()
    p = server(tmp_path, port, "--restart", "never")
    os.kill(ready_pid(tmp_path), signal.SIGKILL)
    p.communicate(timeout=60)
    assert p.returncode == 137 and kinds(tmp_path) == ["died", "dead"]
    assert events.read(RunDir(tmp_path).events)[-1].detail["why"] == "restart = never"


def test_no_policy_no_events(tmp_path):
    p = start(tmp_path, "trainer", "--", "bash", "-c", "exit 3")
    p.communicate(timeout=60)
    assert p.returncode == 3 and kinds(tmp_path) == []
