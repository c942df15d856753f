"""The messages between the orchestrator and a verifiers v1 environment that runs in a Python of its own
(standard library only: both sides import it).

verifiers 0.4 (``verifiers.v1``) and the 0.1.x line slurmrl also loads are one distribution, ``verifiers``,
and ask opposite ``openai`` majors (0.4: ``openai>=2.54,<3``; 0.1.14 through ``openai-agents``: ``>=3``):
they cannot share a virtualenv. So a v1 environment runs in ``.venv-verifiers`` (``scripts/install.sh``)
as a child process of the orchestrator (``slurmrl.envs.verifiers_v1_worker``), and the two speak one JSON
object per line over the child's stdin and stdout:

    orchestrator -> environment            environment -> orchestrator
    {"op": "load", "taskset": ID,           {"op": "loaded", "count": N, "taskset": CLASS, "version": V}
     "args": {...}}
    {"op": "tasks", "indices": [i, ...]}    {"op": "task_list", "tasks": [{"index": i, "key": K,
                                              "messages": [...]}, ...]}
    {"op": "score", "index": i,             {"op": "scored", "reward": R, "rewards": {NAME: SCORE}}
     "messages": [...]}
    any of them                             {"op": "failed", "error": "one line"}

``messages`` are OpenAI chat messages (``{"role", "content"}``, with ``tool_calls`` where the model
made some); a score request's are the conversation after the prompt. The model's tokens never cross
this boundary: the orchestrator samples them (token ids and logprobs from the engine) and sends the
environment only the text it scores. ``to_json`` writes one line; ``from_json`` reads one back and
raises the kit's ``ContractError`` (``slurmrl.contract.reader``) naming the key that is missing or of
the wrong type.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from slurmrl.contract.reader import (
    TEXT,
    TOP,
    WHOLE,
    ContractError,
    Reader,
    Wrong,
    kind,
    list_of,
    loads,
    number,
    table_of,
)

SOURCE = "environment message"  # how an error names a line of the wire


def _get(data: dict, key: str, read: Reader) -> Any:
    if key not in data:
        raise Wrong(key, "is missing")
    return read(data[key], key)


def _table(value: Any, key: str) -> dict:
    return table_of(lambda v, _: v)(value, key)


def _message(value: Any, key: str) -> dict:
    if not isinstance(value, dict) or not isinstance(value.get("role"), str):
        raise Wrong(key, "must be an object with a 'role'")
    return value


def _score(value: Any, key: str) -> float | None:
    return None if value is None else number(value, key)


@dataclass(frozen=True)
class Load:
    taskset: str
    args: dict = field(default_factory=dict)
    op = "load"


@dataclass(frozen=True)
class Loaded:
    count: int
    taskset: str
    version: str
    op = "loaded"


@dataclass(frozen=True)
class Tasks:
    indices: list[int]
    op = "tasks"


@dataclass(frozen=True)
class WireTask:
    index: int
    key: str
    messages: list[dict]


@dataclass(frozen=True)
class TaskList:
    tasks: list[WireTask]
    op = "task_list"


@dataclass(frozen=True)
class Score:
    index: int
    messages: list[dict]
    op = "score"


@dataclass(frozen=True)
class Scored:
    reward: float
    rewards: dict[str, float | None] = field(default_factory=dict)
    op = "scored"


@dataclass(frozen=True)
class Failed:
    error: str
    op = "failed"


Message = Load | Loaded | Tasks | TaskList | Score | Scored | Failed
OPS = (Load, Loaded, Tasks, TaskList, Score, Scored, Failed)


def to_json(msg: Message) -> str:
    """``msg`` as one line of JSON (no newline inside, none at the end)."""
    return json.dumps({"op": msg.op, **asdict(msg)}, separators=(",", ":"))


def _task(data: Any, key: str) -> WireTask:
    if not isinstance(data, dict):
        raise Wrong(key, f"must be an object, got {kind(data)}")
    return WireTask(_get(data, "index", WHOLE), _get(data, "key", TEXT),
                    list(_get(data, "messages", list_of(_message))))


def _read(op: Any, data: dict) -> Message:
    if op == "load":
        return Load(_get(data, "taskset", TEXT), _get(data, "args", _table))
    if op == "loaded":
        return Loaded(_get(data, "count", WHOLE), _get(data, "taskset", TEXT), _get(data, "version", TEXT))
    if op == "tasks":
        return Tasks(list(_get(data, "indices", list_of(WHOLE))))
    if op == "task_list":
        return TaskList([_task(t, f"tasks[{i}]") for i, t in enumerate(_get(data, "tasks", list_of(lambda v, _: v)))])
    if op == "score":
        return Score(_get(data, "index", WHOLE), list(_get(data, "messages", list_of(_message))))
    if op == "scored":
        return Scored(_get(data, "reward", number), _get(data, "rewards", table_of(_score)))
    if op == "failed":
        return Failed(_get(data, "error", TEXT))
    raise Wrong("op", f"is none of {', '.join(m.op for m in OPS)}: {op!r}")


def from_json(line: str) -> Message:
    """The message on ``line``; the kit's ``ContractError`` naming the key when it is none of them."""
    data = loads(line, SOURCE)
    if not isinstance(data, dict):
        raise ContractError(SOURCE, TOP, f"must be an object, got {kind(data)}")
    op = data.get("op")
    try:
        return _read(op, data)
    except Wrong as e:
        raise e.at(f"{SOURCE} {op!r}") from None
