"""The lines ``slurmrl status`` shows under the components' table: each dead task with its cause (its end
record), and what it shows of the run dir's events (RUN_DIR/events.jsonl, ``slurmrl.contract.events``):
the restarts of each component in the shown attempt (a column of the components' table), and one line
per event of every kind in the file (``died``, ``restarted``, ``dead``, ``joined``, ``excluded``,
``attempt_ended``, ...), the newest last; ``status --json`` has them all under ``events``."""

from __future__ import annotations

import time
from pathlib import Path

from slurmrl.app.status_report import ComponentStatus, StatusReport
from slurmrl.contract import events
from slurmrl.rundir import ended
from slurmrl.rundir.paths import RunDir

SHOWN = 20  # event lines in the text; the rest are in events.jsonl and status --json


def read(run_dir: Path) -> list[events.Event]:
    return events.read(RunDir(run_dir).events)


def add(rep: StatusReport, run_dir: Path) -> None:
    """Put the events into a status report: ``events`` (every one) and each component's ``restarts`` in
    the report's attempt."""
    rep.events = read(run_dir)
    for c in rep.components:
        c.restarts = restarts(rep.events, c.name, rep.attempt)


def restarts(found: list[events.Event], component: str, attempt: int | None) -> int:
    return sum(1 for e in found if e.kind == "restarted" and e.component == component
               and (attempt is None or e.attempt is None or e.attempt == attempt))


def dead_lines(components: list[ComponentStatus]) -> list[str]:
    """One line per task that failed, with its cause (its end record), under the components' table."""
    out = []
    for c in components:
        for d in c.dead:
            task = c.name if c.instances <= 1 else f"{c.name}.{d.task}"
            out.append(f"  dead: {ended.phrase(task, d.cause)}")
    return out


def who(e: events.Event) -> str:
    return e.component + (f".{e.task}" if e.task is not None else "")


def line(e: events.Event) -> str:
    """``  restarted: inference.1 on n2, attempt 0, 12:03:04: exited with code 137 (SIGKILL) (restarts: 1)``"""
    where = "".join([f" on {e.node}" if e.node else "", f", attempt {e.attempt}" if e.attempt is not None else "",
                     f", job {e.job_id}" if e.job_id else ""])
    at = time.strftime("%H:%M:%S", time.localtime(e.time))
    detail = ", ".join(f"{k}: {v}" for k, v in sorted(e.detail.items()) if k in ("restarts", "why"))
    return f"  {e.kind}: {who(e)}{where}, {at}{': ' + e.cause if e.cause else ''}" + (
        f" ({detail})" if detail else "")


def lines(found: list[events.Event]) -> list[str]:
    """The events' lines under the components' table: the newest ``SHOWN``, and how many more there are."""
    if not found:
        return []
    head = [f"  events (events.jsonl): {len(found)}" + (f", the last {SHOWN} shown" if len(found) > SHOWN else "")]
    return head + [line(e) for e in found[-SHOWN:]]
