"""The rule every environment named in a recipe passes (orchestrator.environment, eval.environment): a
built-in one takes the arguments given, of its defaults' types, and builds with them; any other name
must be ``package.module:Class`` (checked when the orchestrator imports it). And the rule of the
environments' kinds: a chat-only setting (``slurmrl.envs.protocol.CHAT_ONLY``) the user sets is refused
when every environment of the job is a text one (known here for built-in environments; a custom one's
kind is known once it is imported: the preflight and the orchestrator's start refuse it then)."""

from __future__ import annotations

import inspect

from slurmrl import envs
from slurmrl.envs import BUILTIN
from slurmrl.envs.protocol import chat_only_problem
from slurmrl.errors import UserError
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.roles import chat_only_set


def same_kind(value, default) -> bool:
    """``value`` can stand where ``default`` does (an int is fine for a float; a bool is not an int)."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def check_environment(section: str, name: str, args: dict) -> None:
    """``section.environment`` = ``name`` with ``section.environment_args`` = ``args``."""
    if name in BUILTIN:  # custom environments are checked when the orchestrator imports them
        params = inspect.signature(BUILTIN[name]).parameters
        for arg in args:
            if arg not in params:
                raise UserError(f"{section}.environment_args.{arg}",
                                f"{name!r} takes no argument {arg!r} (it takes {', '.join(params) or 'none'})")
            default = params[arg].default
            if default is not inspect.Parameter.empty and not same_kind(args[arg], default):
                raise UserError(f"{section}.environment_args.{arg}",
                                f"must be {type(default).__name__} like its default {default!r}, not {args[arg]!r}")
        try:  # built-in environments are cheap to build: check the values too
            BUILTIN[name](**args)
        except (TypeError, ValueError) as e:
            raise UserError(f"{section}.environment_args", str(e)) from None
    elif unknown := envs.unknown(name):
        raise UserError(f"{section}.environment", unknown)


def check_kinds(r: Recipe) -> None:
    """Chat-only settings the user set, where every environment the job runs is a built-in text one."""
    if r.orchestrator is None:
        return
    named = {"orchestrator.environment": r.orchestrator.environment}
    if r.eval is not None and r.eval.environment is not None:
        named["eval.environment"] = r.eval.environment
    kinds = {field: (name, envs.kind(name)) for field, name in named.items()}
    if any(kind is None for _, kind in kinds.values()):  # a custom environment: its kind is known on the node
        return
    found = chat_only_problem({f: (n, str(k)) for f, (n, k) in kinds.items()}, chat_only_set(r))
    if found:
        raise UserError(*found)
