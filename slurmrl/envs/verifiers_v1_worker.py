"""A verifiers v1 taskset (``verifiers.v1``, verifiers 0.4) served to the orchestrator over stdin/stdout,
in the environment's own Python (``.venv-verifiers``): the messages are ``slurmrl.contract.envwire``'s.

Run by ``slurmrl.envs.verifiers_v1`` as ``PYTHON -P .../verifiers_v1_worker.py`` with slurmrl's root
on PYTHONPATH; it imports ``verifiers.v1`` and slurmrl's contract leaf only (so the environment's
virtualenv needs no slurmrl install).

What of the taskset is used: its tasks (``Taskset`` views iterate ``load()``; the taskset is resolved by
id as verifiers does, ``verifiers.v1.utils.loaders.taskset_class``, its config validated from the
recipe's ``environment_args``), each task's prompt as the null harness gives it (``system_prompt`` as a
system message, then the prompt: text as one user message, or its messages), and its scoring
(``Task.score``: the ``@vf.reward`` functions and the config's plugged ones, weighted, on a ``Trace``
holding the conversation, the model's turns marked sampled). Refused at load, named: an infinite
taskset, tasks that need a container, tool servers (toolsets), judges, reward functions that need a
runtime (a sandbox).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import os
import sys
from typing import Any

from pydantic import TypeAdapter
from verifiers.v1 import AgentConfig, AgentInfo, Trace
from verifiers.v1.graph import MessageNode
from verifiers.v1.state import State
from verifiers.v1.trace import TraceTask
from verifiers.v1.types import Message
from verifiers.v1.utils.loaders import taskset_class, taskset_config_type

from slurmrl.contract import envwire

MESSAGE: TypeAdapter = TypeAdapter(Message)


class Refused(Exception):
    """What this adapter cannot run, in one line."""


def one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())


def prompt_messages(data: Any) -> list[dict]:
    """The task's opening conversation, as the null harness sends it: its system prompt, then its prompt."""
    out: list[dict] = []
    if data.system_prompt is not None:
        out.append({"role": "system", "content": data.system_prompt})
    if isinstance(data.prompt, str):
        out.append({"role": "user", "content": data.prompt})
    else:
        out.extend(m.model_dump(mode="json", exclude_none=True) for m in data.prompt or [])
    return out


def v1_message(m: dict) -> Any:
    """An OpenAI chat message as a verifiers v1 message (tool calls flattened to ``name``/``arguments``)."""
    m = dict(m)
    if m.get("tool_calls"):
        m["tool_calls"] = [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                           for c in m["tool_calls"]]
    return MESSAGE.validate_python(m)


def runtime_hooks(task: Any) -> list[str]:
    """The task's reward and metric functions that need a runtime (a sandbox) to score."""
    fns = [*task.hooks("reward"), *task.hooks("metric")]
    need = []
    for fn in fns:
        param = inspect.signature(fn).parameters.get("runtime")
        if param is not None and param.default is inspect.Parameter.empty:
            need.append(fn.__name__)
    return need


class Served:
    def __init__(self, msg: envwire.Load):
        try:
            cls = taskset_class(msg.taskset)
        except ModuleNotFoundError as e:
            raise Refused(f"no verifiers v1 taskset {msg.taskset!r} is installed in {sys.executable} "
                          f"({' '.join(str(e).split('.')[0].split())}): install its package there") from None
        config = taskset_config_type(msg.taskset).model_validate({**msg.args, "id": msg.taskset})
        self.taskset = cls(config)
        name = f"taskset {msg.taskset!r} ({cls.__name__})"
        if not self.taskset.bounded:
            raise Refused(f"{name} is infinite; slurmrl draws tasks from a finite taskset")
        if cls.toolsets(config):
            raise Refused(f"{name} has tool servers (toolsets); slurmrl runs v1 tasksets without tools")
        self.tasks = list(self.taskset)
        if not self.tasks:
            raise Refused(f"{name} has no tasks")
        first = self.tasks[0]
        if first.NEEDS_CONTAINER or type(first).toolsets(first.config):
            raise Refused(f"{name}'s tasks need a container or tool servers; slurmrl runs them without a runtime")
        if first.config.judges:
            raise Refused(f"{name}'s tasks are scored by judges; slurmrl scores v1 tasks by their reward functions")
        if need := runtime_hooks(first):
            raise Refused(f"{name}'s reward functions {', '.join(need)} need a runtime (a sandbox); "
                          "slurmrl scores v1 tasks without one")
        self.loaded = envwire.Loaded(len(self.tasks), cls.__name__, importlib.metadata.version("verifiers"))

    def task(self, index: int) -> envwire.WireTask:
        task = self.tasks[index]
        return envwire.WireTask(index, task.key, prompt_messages(task.data))

    def score(self, index: int, messages: list[dict]) -> envwire.Scored:
        task = self.tasks[index]
        trace = Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                      state=State(), agent=AgentInfo(config=AgentConfig(), name="slurmrl"))
        opening = prompt_messages(task.data)
        for k, m in enumerate([*opening, *messages]):
            trace.nodes.append(MessageNode(parent=k - 1 if k else None, message=v1_message(m),
                                           sampled=k >= len(opening) and m["role"] == "assistant"))
        trace.is_completed = trace.ok = True
        asyncio.run(task.score(trace))
        rewards = {k: (r.score if r is not None else None) for k, r in trace.rewards.items()}
        return envwire.Scored(float(trace.reward), rewards)


def answer(served: Served | None, msg: envwire.Message) -> tuple[Served | None, envwire.Message]:
    if isinstance(msg, envwire.Load):
        served = Served(msg)
        return served, served.loaded
    if served is None:
        return None, envwire.Failed(f"{msg.op!r} before 'load'")
    if isinstance(msg, envwire.Tasks):
        bad = [i for i in msg.indices if not 0 <= i < len(served.tasks)]
        if bad:
            return served, envwire.Failed(f"task index {bad[0]} out of range (0..{len(served.tasks) - 1})")
        return served, envwire.TaskList([served.task(i) for i in msg.indices])
    if isinstance(msg, envwire.Score):
        if not 0 <= msg.index < len(served.tasks):
            return served, envwire.Failed(f"task index {msg.index} out of range")
        return served, served.score(msg.index, msg.messages)
    return served, envwire.Failed(f"the environment answers load, tasks and score, not {msg.op!r}")


def main() -> None:
    out = os.fdopen(os.dup(1), "w")  # the messages' own descriptor: whatever the taskset (or a program it
    os.dup2(2, 1)                    # starts) prints to stdout goes to the job's log, not into the messages
    sys.stdout = sys.stderr
    served: Served | None = None
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            served, reply = answer(served, envwire.from_json(line))
        except Exception as e:  # noqa: BLE001 - every failure goes back to the orchestrator as one line
            reply = envwire.Failed(str(e) if isinstance(e, Refused) else one_line(e))
        out.write(envwire.to_json(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
