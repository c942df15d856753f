"""Why an attempt ended, and the nodes kept out of a run: the job script's two notes read back, and the
``attempt_ended`` / ``excluded`` events (slurmrl.contract.events) made from them.

The script writes, in the attempt's log folder, ``END`` as it ends an attempt (one line:
``<unix time> <class> <requeued: yes|no> <why>``) and ``NODE_FAULTS`` when a node of the job is bad
(``<node> <reason>`` per line: Slurm holds it down, drained, failing or not responding, or the node
check at the start named it). It writes notes, not JSON: a batch shell that Slurm is ending has
seconds. ``slurmrl.runtime.steps.attempts`` turns them into events at the next attempt's start (and
as a failed job ends); ``status`` reads both.

Classes: ``node`` (a node failed: NODE_FAIL, a node down mid-step, a fault the node check named, a
task the kernel killed for a hardware error: SIGBUS, ``hardware_fault``),
``preemption``, ``time_limit``, ``cancel``, ``application`` (the job's own failure). Infrastructure
ends (``INFRA``) are requeued within ``slurm.max_requeues`` with the bad nodes excluded; an
application failure never is. Standard library only."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

from slurmrl.contract.events import Event

CLASSES = ("node", "preemption", "time_limit", "cancel", "application")
INFRA = ("node", "preemption", "time_limit")
MAX_NOTE = 4096


@dataclass(frozen=True)
class EndNote:
    time: float
    cls: str
    requeued: bool
    why: str


def _text(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_NOTE).decode("utf-8", "replace")
    except OSError:
        return None


def read_end(path: Path) -> EndNote | None:
    """The END note, or None where there is none or it is not one."""
    text = _text(path)
    parts = (text or "").strip().split(" ", 3)
    if len(parts) < 3 or not parts[0].isdigit() or parts[1] not in CLASSES or parts[2] not in ("yes", "no"):
        return None
    return EndNote(float(parts[0]), parts[1], parts[2] == "yes", parts[3] if len(parts) > 3 else "")


def read_faults(path: Path) -> dict[str, str]:
    """NODE_FAULTS: node -> reason (the first line naming it), in file order."""
    out: dict[str, str] = {}
    for line in (_text(path) or "").splitlines():
        node, _, reason = line.strip().partition(" ")
        if node and node.replace("-", "").replace("_", "").replace(".", "").isalnum():
            out.setdefault(node, reason.strip() or "named bad")
    return out


def append_fault(path: Path, node: str, why: str) -> None:
    """Name ``node`` bad in a NODE_FAULTS note (one line; the script excludes it and requeues)."""
    with open(path, "a") as f:
        f.write(f"{node} {' '.join(why.split())}\n")


# How the kernel ends a task that touched memory a machine check or a memory failure took away
# (memory_failure(): SIGBUS with BUS_MCEERR_AR/AO): the node's fault, not the job's. 128+N is how a
# shell, srun ("Exited with exit code 135") and our guard report a command signal N ended.
HARDWARE_SIGNALS = (signal.SIGBUS,)


def hardware_fault(code: int) -> str | None:
    """Why exit code ``code`` (128+N for signal N) is a hardware error of the node; None when it is not one."""
    for sig in HARDWARE_SIGNALS:
        if code == 128 + sig:
            return f"killed by the kernel for a hardware error ({sig.name}: a machine check or memory failure)"
    return None


def ended_event(attempt: int, job_id: str | None, note: EndNote, nodes: dict[str, str]) -> Event:
    return Event(kind="attempt_ended", component="job", attempt=attempt, job_id=job_id, time=note.time,
                 node=",".join(nodes) or None, cause=note.why,
                 detail={"class": note.cls, "requeued": note.requeued, "nodes": sorted(nodes)})


def excluded_event(attempt: int, job_id: str | None, node: str, reason: str, when: float) -> Event:
    return Event(kind="excluded", component="job", attempt=attempt, job_id=job_id, node=node, cause=reason,
                 time=when)


def excluded(events: list[Event]) -> dict[str, Event]:
    """Every node the run keeps out: node -> the event that first excluded it."""
    out: dict[str, Event] = {}
    for e in events:
        if e.kind == "excluded" and e.node:
            out.setdefault(e.node, e)
    return out


def ends(events: list[Event]) -> dict[tuple[str | None, int], Event]:
    """(job id, attempt) -> the attempt_ended event recorded for it."""
    return {(e.job_id, e.attempt): e for e in events if e.kind == "attempt_ended" and e.attempt is not None}


def used_requeue(end: EndNote | None, preempted: str | None) -> bool:
    """Did this attempt's end use one of ``slurm.max_requeues``: the warning signal requeued it (its
    PREEMPTED note says so) or a node fault did. A manual ``scontrol requeue`` uses none."""
    return "requeued as attempt" in (preempted or "") or (end is not None and end.cls == "node" and end.requeued)
