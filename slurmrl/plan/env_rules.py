"""The rule every environment named in a recipe passes (orchestrator.environment, eval.environment): a
built-in one takes the arguments given, of its defaults' types, and builds with them; any other name
must be ``package.module:Class`` (checked when the orchestrator imports it)."""

from __future__ import annotations

import inspect

from slurmrl import envs
from slurmrl.envs import BUILTIN
from slurmrl.errors import UserError


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
