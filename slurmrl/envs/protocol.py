"""The two environment protocols, each with its declared kind, and the one place that knows their
optional hooks.

An environment class says what it is with a class attribute ``kind``:

- ``kind = "text"`` (``TextEnvironment``): ``prompts(rng, n)`` gives tasks with ``prompt`` text, each
  completed in one request (``/v1/completions``); ``reward(task, completion)`` scores the text.
- ``kind = "chat"`` (``ChatEnvironment``): ``prompts(rng, n)`` gives tasks with ``messages`` (and
  optionally ``tools``), run as conversations through the chat endpoint (``slurmrl.envs.chat``);
  ``reward(task, messages)`` scores the conversation after the prompt.

Optional hooks (``HOOKS``: which kind may have each), called only through ``Environment``, which gives
each its default: ``rewards`` (a whole step's scores at once), ``use_judge`` (the job's [judge]),
``preflight`` (``submit --preflight`` on the node), ``split_key`` (the held-out split's key); a chat
environment's ``begin``, ``respond``, ``call_tool``, ``tools`` and ``use_servers``. A class whose kind is
missing or unknown, that lacks ``prompts`` or a reward, or that has a chat hook while it says ``text`` is
refused when it loads, in one line naming the recipe field (``orchestrator.environment``); tasks of
the other kind's shape are refused when they are drawn.

Chat-only settings (``CHAT_ONLY``) do nothing for a text environment: the planner refuses them for a
built-in one, the preflight and the orchestrator's start for a custom one (``chat_only_problem``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any, ClassVar, Literal, NotRequired, Protocol, TypedDict, get_args, runtime_checkable

Kind = Literal["text", "chat"]
KINDS: tuple[str, ...] = get_args(Kind)

# Recipe fields that only a chat environment's rollouts read (slurmrl.runtime.orchestrator.rollout_chat).
CHAT_ONLY = ("orchestrator.max_turns", "orchestrator.max_rollout_tokens", "orchestrator.env_timeout_s",
             "inference.tool_call_parser")

Message = dict[str, Any]  # an OpenAI chat message: {"role": ..., "content": ..., ...}


class TextTask(TypedDict):
    """A text environment's task: ``prompt`` and whatever its reward needs (more keys)."""

    prompt: str


class ChatTask(TypedDict):
    """A chat environment's task: ``messages`` (system and user), its own ``tools`` when it has any, and
    whatever its reward needs (more keys)."""

    messages: list[Message]
    tools: NotRequired[list[dict]]


@runtime_checkable
class TextEnvironment(Protocol):
    kind: ClassVar[Literal["text"]]

    def prompts(self, rng: random.Random, n: int) -> Sequence[Any]: ...

    def reward(self, task: Any, completion: str) -> float: ...


@runtime_checkable
class ChatEnvironment(Protocol):
    kind: ClassVar[Literal["chat"]]

    def prompts(self, rng: random.Random, n: int) -> Sequence[Any]: ...

    def reward(self, task: Any, messages: list[Message]) -> float: ...


# optional hook -> the kinds that may have it (a chat hook on a text environment would never be called)
HOOKS: dict[str, tuple[str, ...]] = {
    "rewards": KINDS, "use_judge": KINDS, "preflight": KINDS, "split_key": KINDS,
    "begin": ("chat",), "respond": ("chat",), "call_tool": ("chat",), "tools": ("chat",), "use_servers": ("chat",),
}
TASK_KEY = {"text": "prompt", "chat": "messages"}  # what every task of a kind holds


def problem(obj: object) -> str | None:
    """What is wrong with ``obj`` as an environment (its kind, its methods), or None."""
    kind = getattr(obj, "kind", None)
    if kind is None:
        return 'declares no kind: give its class kind = "text" (prompt text) or kind = "chat" (messages)'
    if kind not in KINDS:
        return f'declares kind = {kind!r}; an environment\'s kind is "text" or "chat"'
    missing = [] if callable(getattr(obj, "prompts", None)) else ["prompts(rng, n)"]
    if not callable(getattr(obj, "reward", None)) and not callable(getattr(obj, "rewards", None)):
        missing.append(f"reward(task, {'completion' if kind == 'text' else 'messages'})")
    if missing:
        return f"has no {' and no '.join(missing)}"
    foreign = [h for h, kinds in HOOKS.items() if kind not in kinds and getattr(obj, h, None) is not None]
    if foreign:
        return (f"declares kind = {kind!r} but has {', '.join(foreign)}, which only a chat environment's "
                "conversations call")
    return None


class Environment:
    """An environment object behind its protocol: the runtime calls environments only through this,
    which knows the declared kind and gives every optional hook its default."""

    def __init__(self, obj: object, name: str = "", field: str = "") -> None:
        """``obj`` as the environment ``name`` (what the recipe's ``field`` says; both only for messages)."""
        if why := problem(obj):
            where = f"{field}: " if field else ""
            raise SystemExit(f"slurmrl: {where}environment {name or type(obj).__name__!r} ({type(obj).__name__}) {why}")
        self.obj, self.name = obj, name or type(obj).__name__
        self.kind: str = obj.kind  # type: ignore[attr-defined]  # checked by problem()

    @classmethod
    def of(cls, env: object) -> Environment:
        """``env`` behind its protocol (itself when it already is)."""
        return env if isinstance(env, Environment) else cls(env)

    @property
    def chat(self) -> bool:
        """Its tasks are conversations (messages through the chat endpoint), not prompt text."""
        return self.kind == "chat"

    @property
    def label(self) -> str:
        return type(self.obj).__name__

    def has(self, hook: str) -> bool:
        """The environment has the optional ``hook`` (``HOOKS``) itself."""
        assert hook in HOOKS, f"{hook} is no optional hook of the environment protocols"
        return getattr(self.obj, hook, None) is not None

    def prompts(self, rng: random.Random, n: int) -> list[dict]:
        tasks = list(self.obj.prompts(rng, n))  # type: ignore[attr-defined]
        key = TASK_KEY[self.kind]
        for t in tasks:
            if not isinstance(t, dict) or key not in t:
                raise SystemExit(f"slurmrl: environment {self.name!r} ({self.label}) declares kind = {self.kind!r} "
                                 f"but gave a task without {key!r}: {str(t)[:120]}")
        return tasks

    def reward(self, task: dict, answer: Any) -> float:
        """The reward of one completion (text) or conversation (the messages after the prompt)."""
        if callable(getattr(self.obj, "reward", None)):
            return float(self.obj.reward(task, answer))  # type: ignore[attr-defined]
        return self.rewards([task], [answer])[0]

    def rewards(self, tasks: list[dict], answers: list) -> list[float]:
        """One reward per (task, answer): the environment's ``rewards`` for all at once when it has one."""
        if not self.has("rewards"):
            return [self.reward(t, a) for t, a in zip(tasks, answers)]
        out = [float(x) for x in self.obj.rewards(tasks, answers)]  # type: ignore[attr-defined]
        if len(out) != len(answers):
            raise SystemExit(f"slurmrl: environment {self.label}.rewards returned {len(out)} rewards for "
                             f"{len(answers)} completions")
        return out

    def use_judge(self, judge: object) -> None:
        self.obj.use_judge(judge)  # type: ignore[attr-defined]  # callers ask has("use_judge") first

    def preflight(self) -> None:
        """What the environment reads at run time, read now (``submit --preflight``); nothing by default."""
        if self.has("preflight"):
            self.obj.preflight()  # type: ignore[attr-defined]

    def split_key(self, task: dict) -> str:
        """What identifies ``task`` for the held-out split: the environment's ``split_key``, the prompt, or (a
        chat task, without a prompt) the whole task."""
        if self.has("split_key"):
            return str(self.obj.split_key(task))  # type: ignore[attr-defined]
        if "prompt" not in task:  # messages alone may be the same for every task (guess_number: only the secret differs)
            return json.dumps(task, sort_keys=True, default=str)
        prompt = task.get("prompt")
        return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)

    # ---- a chat environment's hooks ----

    def begin(self, task: dict) -> dict:
        """The rollout's own task (its per-rollout state); the task itself by default."""
        return self.obj.begin(task) if self.has("begin") else task  # type: ignore[attr-defined]

    def respond(self, task: dict, messages: list[Message]) -> list[Message]:
        """The environment's answer to the model's turn; none by default (one turn)."""
        return list(self.obj.respond(task, messages)) if self.has("respond") else []  # type: ignore[attr-defined]

    @property
    def answers_tools(self) -> bool:
        return self.has("call_tool")

    def call_tool(self, name: str, arguments: dict) -> str:
        return str(self.obj.call_tool(name, arguments))  # type: ignore[attr-defined]

    @property
    def tools(self) -> list[dict] | None:
        """The tools (OpenAI schema) every task offers, unless a task has its own."""
        tools = getattr(self.obj, "tools", None)
        return list(tools) if tools else None

    def use_servers(self, urls: list[str], model: str, api_key: str | None) -> None:
        """The servers the orchestrator samples from, for an environment that asks the model itself."""
        if self.has("use_servers"):
            self.obj.use_servers(urls, model, api_key)  # type: ignore[attr-defined]


def chat_only_problem(kinds: dict[str, tuple[str, str]], chat_only: Sequence[str]) -> tuple[str, str] | None:
    """(field, why) for the first chat-only setting in ``chat_only`` (the fields the recipe set) when no
    environment the job runs is a chat environment (``kinds``: recipe field -> (environment, its kind));
    else None."""
    if not chat_only or any(kind == "chat" for _, kind in kinds.values()):
        return None
    names = " and ".join(f"{field} {name!r}" for field, (name, _) in kinds.items())
    return chat_only[0], (f"only applies to a chat environment's conversations; {names} "
                          f"{'is a text environment' if len(kinds) == 1 else 'are text environments'} "
                          "(one completion per prompt): remove the setting")


def refuse_chat_only(loaded: dict[str, Environment], chat_only: Sequence[str]) -> None:
    """SystemExit naming the first chat-only setting the recipe set (``chat_only``) when none of the job's
    environments (``loaded``: recipe field -> environment) is a chat environment: what the planner refuses
    for a built-in environment, here for a custom one once it is loaded (the preflight, the orchestrator)."""
    found = chat_only_problem({f: (e.name, e.kind) for f, e in loaded.items()}, chat_only)
    if found:
        raise SystemExit(f"slurmrl: {found[0]}: {found[1]}")
