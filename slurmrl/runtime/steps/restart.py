"""Restart in place: the supervisor's loop around a serving command (``--restart``, the recipe's
``restart``, ``max_restarts``, ``restart_backoff_s``; ``slurmrl.contract.restart_policy``).

When the command ends without the supervisor having been asked to stop, the death is recorded (a
``died`` event in RUN_DIR/events.jsonl with the cause its guard wrote in the task's end record), what
is left of the dead command's tree is ended (TERM, then KILL: ``tree.end``), and, while the policy
allows, the very same command is launched again after the backoff: the same process on the same node,
so the same GPUs, ports and environment, and it becomes ready as at the first start (its readiness
check, then its ready file; ``start`` does both). A ``restarted`` event says so. When no restart is
left (or ``restart = "never"``) a ``dead`` event ends the record and the task ends with the command's
code: the job script decides what that means for the job (docs/slurm.md, "Restarts").

A server spanning several nodes (``--worker-tasks N``) restarts as a whole: the task whose command ended
first decides and records, the others stop their commands, all meet, then all relaunch
(``slurmrl.runtime.steps.worker_restart``). A stop the supervisor passes on (Slurm's TERM, the script's
teardown) ends the loop at once, in the backoff too. Standard library and psutil only."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from slurmrl.contract import events, job_env
from slurmrl.contract.restart_policy import Policy
from slurmrl.rundir import ended
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.steps import provenance, tree
from slurmrl.runtime.steps.guard import exit_cause
from slurmrl.runtime.steps.worker_restart import MEET_S, Worker


def returned(code: int) -> int:
    """Popen's return code as a shell sees it: 128+N for signal N."""
    return code if code >= 0 else 128 - code


@dataclass(frozen=True)
class Where:
    """The task whose deaths and restarts are recorded: its component, task, node, attempt and job, and
    its files (end record, ready file, the run dir's events); no files outside a job script."""

    component: str
    task: int
    node: str
    attempt: int | None
    job_id: str | None
    events: Path | None
    ended: Path | None
    ready: Path | None

    @classmethod
    def here(cls, component: str) -> Where:
        task = int(os.environ.get("SLURM_PROCID", "0"))
        job_id = os.environ.get("SLURM_JOB_ID") or None
        if not job_env.in_job():
            return cls(component, task, socket.gethostname(), None, job_id, None, None, None)
        run_dir, attempt = RunDir.from_env(), RunDir.attempt_from_env()
        return cls(component, task, socket.gethostname(), int(attempt) if str(attempt).isdigit() else None, job_id,
                   run_dir.events, run_dir.ended_file(attempt, component, task),
                   run_dir.ready_file(attempt, component, task))

    def record(self, kind: str, cause: str = "", **detail) -> None:
        """An event in RUN_DIR/events.jsonl; a restart or a death in lock.toml too (``[[lock.restarts]]``)."""
        if self.events is None:
            return
        event = events.Event(kind, self.component, self.task, self.node, cause, self.attempt, self.job_id,
                             detail=detail)
        try:
            events.append(self.events, event)
            if kind in ("restarted", "dead"):
                provenance.restart(asdict(event))
        except OSError as e:
            print(f"slurmrl: {self.component}.{self.task}: could not record {kind} in {self.events}: {e}", flush=True)

    def cause(self, code: int) -> str:
        """Why the command ended: its end record's cause (its guard wrote it), else its exit code in words."""
        rec = ended.read_ended(self.ended) if self.ended is not None else None
        if rec is not None and rec.cause:
            return rec.cause
        return exit_cause(code)

    def forget(self) -> None:
        """The dead command's end record and ready file go: the task is neither ended nor ready while it
        restarts (the script, ``status``); its next command writes both again."""
        for path in (self.ended, self.ready):
            if path is not None:
                path.unlink(missing_ok=True)


def run(start: Callable[[], subprocess.Popen], policy: Policy, asked: threading.Event, where: Where,
        log: Callable[[str], None], worker: Worker | None = None) -> tuple[int, int]:
    """Run ``start()``'s command until it ends for good; returns (its last code, the restarts made).
    ``worker``: this task is one of several of a server spanning nodes, which restart as a whole
    (``slurmrl.runtime.steps.worker_restart``)."""
    restarts = 0
    while True:
        child, peer = start(), threading.Event()
        if worker is not None:
            worker.watch(restarts + 1, child, peer)
        code = returned(child.wait())
        again = policy.wants(code, asked.is_set(), restarts)
        if asked.is_set() or (code == 0 and not again and not peer.is_set()):  # stopped as asked, or finished
            return code, restarts
        cause = where.cause(code)
        why = "restart = never" if policy.mode == "never" else f"no restarts left (max_restarts = {policy.max_restarts})"
        first, extra = True, {}
        if worker is not None:
            extra = {"tasks": list(worker.tasks)}
            first, again, cause = round_of(worker, restarts + 1, peer.is_set(), again, cause, why)
        if first:
            where.record("died", cause, restarts=restarts, code=code, **extra)
        if not again:
            if first:
                where.record("dead", cause, restarts=restarts, code=code, why=why, **extra)
            log(f"{cause}; {why if first else 'the worker is dead'}: the task ends")
            return code, restarts
        where.forget()
        left = tree.end()  # what the dead command left behind: its EngineCore, its workers
        if worker is not None and not met(worker, restarts + 1, asked, where, log, code=code, restarts=restarts):
            return code, restarts
        delay = policy.delay(restarts + 1)
        whole = f" with the {len(worker.tasks)} tasks of its worker" if worker is not None else ""
        log(f"{cause}; ended {len(left)} process(es) it left; restart {restarts + 1} of {policy.max_restarts} "
            f"in {delay:g}s, in place{whole}")
        if asked.wait(delay):
            return code, restarts
        restarts += 1
        if first:
            where.record("restarted", cause, restarts=restarts, backoff_s=delay, **extra)


def round_of(worker: Worker, k: int, peer: bool, again: bool, cause: str, why: str) -> tuple[bool, bool, str]:
    """Restart ``k`` of a worker spanning tasks: (whether this task's command ended first and so decides
    and records it, whether the worker restarts, the cause). A task stopped for another's death, or beaten
    to the claim, follows what the claim says."""
    if not peer and worker.claim(k, not again, cause if again else f"{cause}; {why}"):
        return True, again, cause
    said = worker.claimed(k)
    return False, said.startswith("restart"), f"the worker's {said.partition(' ')[2] or 'other task ended'}"


def met(worker: Worker, k: int, asked: threading.Event, where: Where, log: Callable[[str], None], **detail) -> bool:
    """Whether every task of ``worker`` has ended its command for restart ``k`` in time (and no stop came);
    a task that did not is recorded: the worker is dead."""
    missing = worker.meet(k, asked)
    if asked.is_set():
        return False
    if missing:
        late = f"task(s) {', '.join(map(str, missing))} of the worker did not end within {MEET_S:g}s"
        where.record("dead", late, why=late, tasks=list(worker.tasks), **detail)
        log(f"{late}: the worker cannot restart as a whole; the task ends")
        return False
    return True
