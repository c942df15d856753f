"""Environments with verifiable rewards, and loading custom ones by import path.

An environment class declares its kind and has two methods (``slurmrl.envs.protocol``):

    kind = "text"                                       # or "chat" (slurmrl.envs.chat)
    prompts(rng: random.Random, n: int) -> list[dict]   # each has "prompt" (text) plus what reward needs
    reward(task: dict, completion: str) -> float        # higher is better

and may have more, each optional (``slurmrl.envs.protocol.HOOKS``): ``rewards(tasks, completions) ->
list[float]``, which the orchestrator then calls once per step instead of ``reward`` per sample (to batch
the scoring), ``use_judge(judge)``, which gets the job's judge
(``slurmrl.runtime.orchestrator.judge_client.JudgeClient``) when the recipe has a [judge], ``preflight()``
and ``split_key(task)``. ``load`` gives the environment behind its protocol (``protocol.Environment``).

Built in: ``reverse_text`` (similarity to the reversed string), ``arithmetic`` (exact match),
``judge`` (prompts from a dataset, rewards from the job's judge), ``guess_number`` (a chat
environment: several turns, "Higher."/"Lower." after each guess).

A chat environment's tasks hold ``messages`` in place of ``prompt`` text; it may answer after each
model turn (``respond``), answer tool calls (``call_tool``), and its ``reward`` gets the
conversation's messages: ``slurmrl.envs.chat`` says how.
Custom: ``package.module:Class``. Either is constructed with ``orchestrator.environment_args``
as keyword arguments.

An installed verifiers environment: ``verifiers:ENV_ID``, loaded with
``verifiers.load_environment(ENV_ID, **environment_args)`` and run as a chat environment
(``slurmrl.envs.verifiers_env``; needs the ``verifiers`` extra, which this package imports only then).
A verifiers v1 taskset (verifiers 0.4, ``verifiers.v1``): ``verifiers-v1:TASKSET_ID``, run as a chat
environment in a Python of its own (``slurmrl.envs.verifiers_v1``: ``.venv-verifiers``).
"""

from __future__ import annotations

import functools
import importlib
import traceback
from collections.abc import Callable

from slurmrl.envs.guess_number import GuessNumber
from slurmrl.envs.judge import PROMPT_SOURCES, Judge
from slurmrl.envs.protocol import ChatEnvironment, Environment, TextEnvironment
from slurmrl.envs.text import answer_line  # noqa: F401  (envs.answer_line: custom environments use it)

BUILTIN: dict[str, type[TextEnvironment] | type[ChatEnvironment]] = {
    **PROMPT_SOURCES, "judge": Judge, "guess_number": GuessNumber}
VERIFIERS = "verifiers:"  # verifiers:ENV_ID, an installed verifiers environment
VERIFIERS_V1 = "verifiers-v1:"  # verifiers-v1:TASKSET_ID, a verifiers v1 taskset (slurmrl.envs.verifiers_v1)


def unknown(name: str) -> str | None:
    """Why ``name`` names no environment (neither built in, ``verifiers:ENV_ID``, ``verifiers-v1:TASKSET_ID``
    nor ``package.module:Class``), or None."""
    for prefix, what in ((VERIFIERS, "verifiers environment"), (VERIFIERS_V1, "verifiers v1 taskset")):
        if name.startswith(prefix):
            return None if name.removeprefix(prefix).strip() else f"{name!r} names no {what} id"
    if name in BUILTIN or ":" in name:
        return None
    return (f"{name!r} is not built in ({', '.join(BUILTIN)}), verifiers:ENV_ID, verifiers-v1:TASKSET_ID "
            "nor package.module:Class")


def kind(name: str) -> str | None:
    """The kind of the environment ``name`` as far as the name tells (built in, ``verifiers:ENV_ID``: chat);
    None for ``package.module:Class``, whose kind is known once it is imported."""
    if name in BUILTIN:
        return BUILTIN[name].kind
    return "chat" if name.startswith((VERIFIERS, VERIFIERS_V1)) else None


def load(name: str, args: dict | None = None, field: str = "orchestrator.environment") -> Environment:
    """The environment ``name`` (built in, ``verifiers:ENV_ID``, ``verifiers-v1:TASKSET_ID`` or
    ``package.module:Class``) built with keyword
    ``args``, behind its protocol; ``field``: the recipe field that names it (for messages)."""
    why = unknown(name)
    if why:
        raise SystemExit(f"slurmrl: environment {why}")
    cls: Callable
    if name in BUILTIN:
        cls = BUILTIN[name]
    elif name.startswith(VERIFIERS):
        cls = functools.partial(verifiers_adapter(name), name.removeprefix(VERIFIERS))
    elif name.startswith(VERIFIERS_V1):
        # imported only here (its worker's wire protocol and subprocess are no part of `slurmrl plan`'s start-up)
        cls = functools.partial(importlib.import_module("slurmrl.envs.verifiers_v1").VerifiersV1Env,
                                name.removeprefix(VERIFIERS_V1).strip())
    else:
        module, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except Exception as e:  # noqa: BLE001 - any failure importing user code is the user's to read
            raise SystemExit(f"slurmrl: cannot load environment {name!r}: {raised(e)} "
                             "(is its package on PYTHONPATH or installed in the job's Python?)") from None
    try:
        env = cls(**(args or {}))
    except Exception as e:  # noqa: BLE001
        raise SystemExit(f"slurmrl: environment {name!r} with arguments {args or {}}: {raised(e)}") from None
    return Environment(env, name, field)  # a broken environment class fails here, before any rollout


def verifiers_adapter(name: str):
    """``slurmrl.envs.verifiers_env.VerifiersEnv``, imported only here: the package imports without verifiers."""
    try:
        module = importlib.import_module("slurmrl.envs.verifiers_env")
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "verifiers":
            raise
        raise SystemExit(f"slurmrl: environment {name!r} needs the verifiers extra: pip install 'slurmrl[verifiers]'") \
            from None
    return module.VerifiersEnv


def raised(e: BaseException) -> str:
    """"ZeroDivisionError in env.py:36: division by zero": the exception and where the user's code raised it."""
    frames = [f for f in traceback.extract_tb(e.__traceback__)[1:]  # not load() itself, nor importlib's own
              if not f.filename.startswith("<") and "/importlib/" not in f.filename]
    at = f" in {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
    return f"{type(e).__name__}{at}: {e}"


def rewards(env, tasks: list[dict], completions: list[str]) -> list[float]:
    """One reward per (task, completion): the environment's ``rewards`` for all at once when it has one."""
    return Environment.of(env).rewards(tasks, completions)
