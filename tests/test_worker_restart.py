"""A server spanning several tasks restarts as a whole (slurmrl.runtime.steps.worker_restart), without Slurm:
two real supervisor restart loops (``restart.run`` with a ``Worker``) in two processes, as the two tasks of a
worker spanning two nodes, each around a real command (``sleep``); SIGKILL of one task's command by pid.

Checked: the other task's command is stopped too and both are relaunched (new pids), the death and the
restart are recorded once (by the task that died, naming the worker's tasks); with no restart left the
death is final for both tasks, recorded ``dead`` once. The cluster test with real vLLM:
tests/test_multinode_worker.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from polling import wait_for

from slurmrl.contract import events

TASK = r"""
import signal, subprocess, sys, threading
from pathlib import Path
from slurmrl.contract.restart_policy import Policy
from slurmrl.runtime.steps import restart, tree
from slurmrl.runtime.steps.worker_restart import Worker

folder, log, task, pids = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
tree.become_subreaper()
asked = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: asked.set())


def start():
    p = subprocess.Popen(["sleep", "600"])
    with pids.open("a") as f:
        f.write(f"{task} {p.pid}\n")
    return p


where = restart.Where("decode", task, "n1", 0, "7", log, None, None)
code, restarts = restart.run(start, Policy("on-failure", 1, 0), asked, where, print, Worker(task, 0, 2, folder))
print(f"END {code} {restarts}", flush=True)
"""


def started(pids: Path) -> list[tuple[int, int]]:
    lines = pids.read_text().split("\n") if pids.exists() else []
    return [(int(t), int(p)) for t, p in (line.split() for line in lines if line.strip())]


def test_a_worker_of_two_tasks_restarts_as_a_whole_then_dies_as_one(tmp_path):
    folder, log, pids = tmp_path / "meet", tmp_path / "events.jsonl", tmp_path / "pids"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    tasks = [subprocess.Popen([sys.executable, "-c", TASK, str(folder), str(log), str(t), str(pids)], env=env,
                              stdout=subprocess.PIPE, text=True) for t in (0, 1)]
    try:
        first = dict(wait_for(lambda: len(started(pids)) == 2 and started(pids), "both tasks' commands", poll=0.2))
        os.kill(first[1], signal.SIGKILL)  # task 1's command dies: the worker restarts, task 0's command too
        second = dict(wait_for(lambda: len(started(pids)) == 4 and started(pids)[2:], "both relaunched", poll=0.2))
        assert second[0] != first[0] and second[1] != first[1]
        for t in (0, 1):  # the commands of the first round are gone
            assert not os.path.exists(f"/proc/{first[t]}") or "zombie" in Path(f"/proc/{first[t]}/status").read_text()
        rows = events.read(log)
        assert [(e.kind, e.task) for e in rows] == [("died", 1), ("restarted", 1)], rows
        assert rows[0].detail["tasks"] == [0, 1] and "137" in rows[0].cause, rows[0]

        os.kill(second[0], signal.SIGKILL)  # no restart left: the worker is dead, both tasks end
        outs = [p.communicate(timeout=60)[0] for p in tasks]
        assert [p.returncode for p in tasks] == [0, 0], outs
        assert "END 137 1" in outs[0] and "END 143 1" in outs[1], outs
        assert [(e.kind, e.task) for e in events.read(log)][2:] == [("died", 0), ("dead", 0)]
        assert len(started(pids)) == 4  # nothing relaunched after the final death
        assert not os.path.exists(f"/proc/{second[1]}") or "zombie" in Path(f"/proc/{second[1]}/status").read_text()
    finally:
        for p in tasks:
            if p.poll() is None:
                p.kill()
