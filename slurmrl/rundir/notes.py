"""One-line notes the job script writes into an attempt's log folder and ``status`` shows: FAILED
(why the job failed), STOPPED (Slurm ended the attempt), PREEMPTED (the warning signal came),
``<component>.waiting`` (why a front is not serving yet).

They may quote a component's own words, so they are read as text with any undecodable byte
replaced, colour codes dropped and other control characters (a carriage return) shown as '?'; a file of
binary data (NUL bytes) is one line naming it."""

from __future__ import annotations

from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.rundir.plain import plain
from slurmrl.rundir.read import read_bytes

MAX_NOTE_BYTES = 1 << 20


def clean(text: str) -> str:
    """Colour codes dropped (slurmrl.rundir.plain), any other control character shown as '?'."""
    return "".join(c if c.isprintable() or c in "\n\t" else "?" for c in plain(text))


def read_note(path: Path) -> str | None:
    """The note's text, stripped ('' when empty); None when there is none."""
    data = read_bytes(path, missing=None, limit=MAX_NOTE_BYTES)
    if data is None:
        return None
    if b"\0" in data:
        raise UserError(str(path), "holds binary data, not a note; remove it")
    return clean(data.decode("utf-8", errors="replace")).strip()
