"""The job's record of what happened to its parts: one JSON line per event in ``RUN_DIR/events.jsonl``
(``RunDir.events()``), appended by whoever saw it and read by ``status``, ``status --json``, the report
and lock.toml, so that a result produced through restarts, dead servers or a bad node says so.

    {"time": 1765071000.5, "kind": "restarted", "component": "inference", "task": 1, "node": "n2",
     "cause": "exited with code 137 (SIGKILL)", "attempt": 0, "job_id": "42", "detail": {"restarts": 1}}

Kinds (``KINDS``): a serving task that ``died`` (its engine ended) or was declared ``dead`` (no more
restarts, or it stopped answering), one ``restarted`` in place, one ``readmitted`` (it has today's weights
and takes rollouts again), a server that ``joined`` from another job or ``left``; a node ``excluded``
from the job's later attempts, and why an ``attempt_ended`` (its class in ``detail``). A line is
appended whole (one ``write`` of a short line in append mode), so concurrent writers on a shared
filesystem do not interleave; a reader skips a line that breaks the contract rather than fail the
command that reads it (status must show what it can). Standard library only."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slurmrl.contract import reader

KINDS = ("died", "dead", "restarted", "readmitted", "joined", "left", "excluded", "attempt_ended")
MAX_LINE = 8192  # a row is a few hundred bytes; a longer line is not ours


def _detail(value: Any, key: str) -> dict:
    if not isinstance(value, dict):
        raise reader.Wrong(key, f"must be an object, got {reader.kind(value)}")
    return value


@dataclass(frozen=True)
class Event:
    kind: str = field(metadata=reader.spec(reader.TEXT))
    component: str = field(metadata=reader.spec(reader.TEXT))
    task: int | None = field(default=None, metadata=reader.spec(reader.WHOLE, optional=True))
    node: str | None = field(default=None, metadata=reader.spec(reader.TEXT, optional=True))
    cause: str = field(default="", metadata=reader.spec(reader.TEXT))
    attempt: int | None = field(default=None, metadata=reader.spec(reader.WHOLE, optional=True))
    job_id: str | None = field(default=None, metadata=reader.spec(reader.TEXT, optional=True))
    time: float = field(default_factory=time.time, metadata=reader.spec(reader.number))
    detail: dict[str, Any] = field(default_factory=dict, metadata=reader.spec(_detail))

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"event kind {self.kind!r} is not one of {', '.join(KINDS)}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, allow_nan=False)

    @classmethod
    def from_json(cls, line: str, source: str = "event", number: int | None = None) -> Event:
        """One line back; a ``ContractError`` (one line naming ``source``, the line ``number`` and the key)
        where it breaks the contract."""
        data = reader.loads(line, source, number)
        try:
            unknown = sorted(set(data) - set(cls.__dataclass_fields__)) if isinstance(data, dict) else []
            if unknown:
                raise reader.Wrong(unknown[0], "is not a key of an event")
            return cls(**reader.fields_of(cls, data))
        except reader.Wrong as e:
            raise e.at(source, number) from None
        except ValueError as e:  # a kind that is none of KINDS
            raise reader.ContractError(source, "kind", str(e), number) from None


def append(path: Path | str, event: Event) -> None:
    """Add ``event`` as one line (O_APPEND, one write), making the folder if needed."""
    line = (event.to_json() + "\n").encode()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read(path: Path | str) -> list[Event]:
    """Every well-formed event of ``path`` in file order; [] when there is none (a bad line is skipped;
    a symbolic link, a FIFO or a folder is none: the bounded reader of ``slurmrl.contract.reader``)."""
    try:
        raw = reader.read_bounded(path, reader.MAX_BYTES, follow=False)
    except (OSError, reader.NotRegular):
        return []
    out = []
    for n, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip() or len(line) > MAX_LINE:
            continue
        try:
            out.append(Event.from_json(line, str(path), n))
        except (reader.ContractError, TypeError):
            continue
    return out
