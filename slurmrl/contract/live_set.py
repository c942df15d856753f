"""The live set of a job's inference servers as the orchestrator sees it, and what the trainer's last
broadcast reached: the two files through which the orchestrator (who owns the live set,
``slurmrl.runtime.orchestrator.members``) and a trainer that sends the weights by broadcast
(``slurmrl.runtime.trainer.transfer_group``) agree on the transfer group. Standard library only.

- ``RUN_DIR/servers-live.json`` (``LiveSet``), written by the orchestrator whenever a server changes
  state: each server's URL, its state and its ``incarnation`` (how many times it came back: a server
  restarted in place has the same URL but a new process, outside any group). The trainer reads it
  before every update: the group is every ``admitted`` or ``waiting`` server (a server that came back or
  joined and waits for the weights), formed again when that set (or an incarnation) changed. A file of
  another attempt (a requeue) is not this one's live set: the trainer then takes every planned server.

      {"attempt": "0", "written": 1765071000.5, "members": [{"url": "http://n1:8001", "state": "admitted",
       "incarnation": 0}, {"url": "http://n2:8001", "state": "waiting", "incarnation": 1}]}

- ``RUN_DIR/servers-synced.json`` (``Reached``), written by the trainer after each update: the step, the
  servers that took its weights, and the servers it dropped from the group with why (not answering, not
  joining within the deadline). The orchestrator admits a waiting server once it is among ``urls`` of
  the step the others serve, and declares a dropped admitted server dead.

      {"step": 7, "urls": ["http://n1:8001", "http://n2:8001"], "dropped": {}}

Both are written whole (a private temporary, then one rename): a reader sees a whole file or none; a
file that breaks the contract reads as none.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

from slurmrl.contract import reader

STATES = ("admitted", "waiting", "dead")
IN_GROUP = ("admitted", "waiting")  # the servers a broadcast goes to
MAX_BYTES = 1 << 20
T = TypeVar("T", "LiveSet", "Reached")


@dataclass(frozen=True)
class Member:
    url: str
    state: str
    incarnation: int = 0

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"live set state {self.state!r}: one of {', '.join(STATES)}")
        if not isinstance(self.url, str) or isinstance(self.incarnation, bool) or not isinstance(self.incarnation, int):
            raise ValueError("a live set member has a url (text) and an incarnation (a whole number)")


@dataclass(frozen=True)
class LiveSet:
    attempt: str
    members: tuple[Member, ...]
    written: float = 0.0

    def in_group(self) -> list[Member]:
        return [m for m in self.members if m.state in IN_GROUP]

    def to_json(self) -> str:
        return json.dumps({"attempt": self.attempt, "written": self.written,
                           "members": [asdict(m) for m in self.members]}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LiveSet:
        data = reader.loads(text, "live set")
        if not isinstance(data, dict) or set(data) != {"attempt", "written", "members"}:
            raise ValueError("a live set has attempt, written and members")
        if not isinstance(data["attempt"], str) or not isinstance(data["members"], list):
            raise ValueError("a live set's attempt is text and its members a list")
        members = []
        for m in data["members"]:
            if not isinstance(m, dict) or set(m) != {"url", "state", "incarnation"}:
                raise ValueError("a live set member has url, state and incarnation")
            members.append(Member(**m))
        return cls(data["attempt"], tuple(members), float(data["written"]))


@dataclass(frozen=True)
class Reached:
    step: int
    urls: tuple[str, ...]
    dropped: dict[str, str] = field(default_factory=dict)  # url -> why it is out of the group

    def to_json(self) -> str:
        return json.dumps({"step": self.step, "urls": list(self.urls), "dropped": self.dropped}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Reached:
        data = reader.loads(text, "broadcast record")
        if not isinstance(data, dict) or set(data) != {"step", "urls", "dropped"}:
            raise ValueError("a broadcast's record has step, urls and dropped")
        step, urls, dropped = data["step"], data["urls"], data["dropped"]
        if isinstance(step, bool) or not isinstance(step, int) or not isinstance(urls, list) \
                or not all(isinstance(u, str) for u in urls) or not isinstance(dropped, dict) \
                or not all(isinstance(k, str) and isinstance(v, str) for k, v in dropped.items()):
            raise ValueError("a broadcast's record: step a whole number, urls a list of text, dropped text by url")
        return cls(step, tuple(urls), dict(dropped))


def write(path: Path | str, value: LiveSet | Reached) -> None:
    """``value`` into ``path`` whole: a temporary sibling of a fresh name, then one rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(value.to_json() + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _text(path: Path | str) -> str | None:
    try:
        raw = reader.read_bounded(path, MAX_BYTES + 1)
    except (OSError, ValueError):
        return None
    return raw.decode("utf-8", "replace") if len(raw) <= MAX_BYTES else None


def _read(path: Path | str, kind: type[T]) -> T | None:
    text = _text(path)
    try:
        return kind.from_json(text) if text is not None else None  # type: ignore[attr-defined]
    except (ValueError, TypeError):
        return None


def read_live(path: Path | str) -> LiveSet | None:
    """The live set in ``path``; None when there is none (or it is not one)."""
    return _read(path, LiveSet)


def read_reached(path: Path | str) -> Reached | None:
    """The last broadcast's record in ``path``; None when there is none (or it is not one)."""
    return _read(path, Reached)
