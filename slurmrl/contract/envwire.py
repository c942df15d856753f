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
raises ``WireError`` naming the key that is missing or of the wrong type.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


class WireError(ValueError):
    """A line that is not one of these messages: one line naming the key."""


def _get(data: dict, key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in data:
        raise WireError(f"environment message {data.get('op')!r} has no {key!r}")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise WireError(f"environment message {data.get('op')!r}: {key!r} is {type(value).__name__}")
    return value


def _messages(data: dict) -> list[dict]:
    msgs = _get(data, "messages", list)
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in msgs):
        raise WireError(f"environment message {data.get('op')!r}: 'messages' must be objects with a 'role'")
    return msgs


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


def to_json(msg: Message) -> str:
    """``msg`` as one line of JSON (no newline inside, none at the end)."""
    return json.dumps({"op": msg.op, **asdict(msg)}, separators=(",", ":"))


def _task(data: Any) -> WireTask:
    if not isinstance(data, dict):
        raise WireError("environment message 'task_list': each task must be an object")
    data = {"op": "task_list", **data}
    return WireTask(_get(data, "index", int), _get(data, "key", str), _messages(data))


def from_json(line: str) -> Message:
    """The message on ``line``; ``WireError`` when it is none of them."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as e:
        raise WireError(f"environment message is not JSON ({e.msg}): {line[:120]!r}") from None
    if not isinstance(data, dict):
        raise WireError(f"environment message is not an object: {line[:120]!r}")
    op = data.get("op")
    if op == "load":
        return Load(_get(data, "taskset", str), _get(data, "args", dict))
    if op == "loaded":
        return Loaded(_get(data, "count", int), _get(data, "taskset", str), _get(data, "version", str))
    if op == "tasks":
        indices = _get(data, "indices", list)
        if not all(type(i) is int for i in indices):
            raise WireError("environment message 'tasks': 'indices' must be whole numbers")
        return Tasks(indices)
    if op == "task_list":
        return TaskList([_task(t) for t in _get(data, "tasks", list)])
    if op == "score":
        return Score(_get(data, "index", int), _messages(data))
    if op == "scored":
        rewards = _get(data, "rewards", dict)
        if not all(v is None or isinstance(v, (int, float)) and not isinstance(v, bool) for v in rewards.values()):
            raise WireError("environment message 'scored': 'rewards' must map names to numbers")
        return Scored(float(_get(data, "reward", (int, float))), rewards)
    if op == "failed":
        return Failed(_get(data, "error", str))
    raise WireError(f"environment message has unknown op {op!r}")
