"""RUN_DIR/logs/attempt-N/phases: start-up milestones, ``<unix time> <what>`` per line.

Written by the batch shell (``echo "$(date +%s) ..." >> phases``) and by programs (:func:`add_phase`);
read by ``slurmrl status``. A line that is not ``<digits> <text>`` (a hand edit, a partial last
line) is left out: the file is a log, not a contract."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from slurmrl.rundir.read import read_text


@dataclass(frozen=True)
class Phase:
    time: int
    what: str


def add_phase(path: Path, what: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    what = " ".join(str(what).split())  # one line, whatever it says
    with open(path, "a") as f:  # one short append: atomic next to the batch shell's
        f.write(f"{int(time.time())} {what}\n")


def read_phases(path: Path) -> list[Phase]:
    text = read_text(path, missing="")
    out = []
    for line in text.splitlines():
        ts, _, what = line.partition(" ")
        if ts.isascii() and ts.isdigit() and len(ts) <= 12:
            out.append(Phase(int(ts), what.strip()))
    return out
