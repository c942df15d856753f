"""End records, ``RUN_DIR/logs/attempt-N/ended/<component>.<task>``: how and when one task's command
ended, written inside the step (by its guard, else its supervisor) the moment it ends. One line, so
the batch shell reads it with ``read``:

    <unix time, ns> <exit code> <state> <the step's task count> <cause, to the end of the line>

``state`` is ``finished`` (exit 0, not a server), ``stopped`` (it was asked to stop: a planned stop),
or ``failed`` (a non-zero exit, a failure probe matched its log, or a server that ended without being
asked, whatever its code: vLLM's API server exits 0 when its engine dies). ``cause`` says why in a
few words ("ZeroDivisionError in env.py:36: division by zero", "exited with code 137 (SIGKILL)").

The job script's ``abort`` names the task that failed first (the earliest ``failed`` record), and
``slurmrl status`` shows a failed server as dead and leaves it out of the endpoints while the job
serves on. Standard library and errors only (it is written from inside job steps)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import NamedTuple

from slurmrl.errors import UserError
from slurmrl.rundir.read import read_bytes

STATES = ("finished", "stopped", "failed")
MAX_CAUSE = 300  # characters of a cause kept: one line of FAILED, not a log
MAX_BYTES = 4096


class Ended(NamedTuple):
    time_ns: int
    code: int
    state: str
    ntasks: int
    cause: str

    @property
    def failed(self) -> bool:
        return self.state == "failed"


def one_line(text: str, limit: int = MAX_CAUSE) -> str:
    """``text`` as one printable line of at most ``limit`` characters."""
    words = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return words if len(words) <= limit else words[:limit - 3] + "..."


def render(ended: Ended) -> str:
    if ended.state not in STATES:
        raise ValueError(f"an end record's state is one of {', '.join(STATES)}: {ended.state!r}")
    return f"{int(ended.time_ns)} {int(ended.code)} {ended.state} {max(int(ended.ntasks), 1)} {one_line(ended.cause)}".rstrip() + "\n"


def write_ended(path: Path, ended: Ended, replace: bool = True) -> bool:
    """Write the record atomically; with ``replace=False`` only when there is none yet (the guard's
    record, written first, is the truer one). True when it was written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(render(ended))
    if replace:
        tmp.replace(path)
        return True
    try:
        os.link(tmp, path)  # fails when a record is there: the first writer wins
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def record(code: int, state: str, cause: str = "", ntasks: int = 1, at_ns: int | None = None) -> Ended:
    return Ended(time.time_ns() if at_ns is None else at_ns, code, state, ntasks, one_line(cause))


def _int(word: str, what: str, path: Path) -> int:
    if not (word.isascii() and word.lstrip("-").isdigit() and len(word) <= 20):
        raise UserError(str(path), f"its {what} should be a whole number, not {word[:40]!r}")
    return int(word)


def read_ended(path: Path) -> Ended | None:
    """The record, or None when there is none or it is being written (empty); anything else that is
    not a record is one line naming the file."""
    data = read_bytes(path, missing=None, limit=MAX_BYTES)
    if data is None or not data.strip():
        return None
    if b"\0" in data:
        raise UserError(str(path), "holds binary data, not an end record; remove it")
    line = data.decode("utf-8", errors="replace").splitlines()[0]
    words = line.split(" ", 4)
    if len(words) < 4:
        raise UserError(str(path), "should be one line: <time ns> <exit code> <state> <tasks> <cause>")
    t, code, state, ntasks = (words + [""])[:4]
    if state not in STATES:
        raise UserError(str(path), f"its state should be one of {', '.join(STATES)}, not {state[:40]!r}")
    return Ended(_int(t, "time", path), _int(code, "exit code", path), state, max(_int(ntasks, "task count", path), 1),
                 one_line(words[4] if len(words) > 4 else ""))


def read_all(folder: Path) -> dict[tuple[str, int], Ended]:
    """(component, task) -> record, for every record in an attempt's ``ended`` folder."""
    out = {}
    for f in sorted(Path(folder).glob("*.*")):
        name, _, task = f.name.rpartition(".")
        if name and not f.name.startswith(".") and task.isascii() and task.isdigit() and len(task) <= 9:
            found = read_ended(f)
            if found is not None:
                out[(name, int(task))] = found
    return out


def first_failure(records: dict[tuple[str, int], Ended]) -> tuple[str, int, Ended] | None:
    """The task that failed first: (component, task, record), or None."""
    failed = [(e.time_ns, name, task, e) for (name, task), e in records.items() if e.failed]
    if not failed:
        return None
    _, name, task, e = min(failed)
    return name, task, e


def all_stopped(records: dict[tuple[str, int], Ended], name: str) -> bool:
    """Every task of ``name`` that has a record was asked to stop (``stopped``): a planned stop (the
    script's teardown, a cancel, salloc's end), whatever code Slurm records for its step."""
    mine = [e for (n, _), e in records.items() if n == name]
    return bool(mine) and all(e.state == "stopped" for e in mine)


def who(name: str, task: int, ended: Ended) -> str:
    """How FAILED and status name a task: the component, with its task when its step has several."""
    return name if ended.ntasks <= 1 else f"{name}.{task}"


VERBS = ("exited ", "killed ", "hung", "ended ")  # a cause that reads on from the name (the job script's own words)


def phrase(name: str, cause: str) -> str:
    """"trainer exited with code 3", "orchestrator: ZeroDivisionError in env.py:36" (as the job script's
    first_failure writes FAILED)."""
    return f"{name} {cause}" if cause.startswith(VERBS) else f"{name}: {cause}"
