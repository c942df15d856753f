"""The one shell-quoting filter. Every value that reaches bash in a rendered script goes through ``shq``."""

from __future__ import annotations

import re
import shlex

from slurmrl.plan.model import Sh


def shq(value: object) -> str:
    """Quote a value for bash so that bash receives it verbatim.

    Plain values (user text, numbers) are single-quoted by ``shlex.quote``: no expansion of any
    kind happens inside. Planner-written shell expressions (``Sh``) are double-quoted so their
    ``${VAR}`` references expand once at run time but are never word-split or globbed.
    """
    if isinstance(value, Sh):
        if '"' in value.sh or "`" in value.sh or "\\" in value.sh or "\n" in value.sh:
            raise ValueError(f"planner shell expression must not contain quotes or backticks: {value.sh!r}")
        return f'"{value.sh}"'
    if isinstance(value, dict) and set(value) == {"sh"}:  # a Sh that went through model_dump
        return shq(Sh(**value))
    if isinstance(value, bool):
        value = "true" if value else "false"
    return shlex.quote(str(value))


def shjoin(values) -> str:
    return " ".join(shq(v) for v in values)


_SBATCH_PLAIN = re.compile(r"^[A-Za-z0-9_.,:/%@=+\-\[\]]*$")


def sbatch_value(value: str) -> str:
    """A value on an ``#SBATCH`` line. sbatch (not bash) reads these lines: outside double quotes
    it treats whitespace, quotes and ``#`` specially; inside them, backslash escapes ``\\`` and ``"``.
    Line breaks are refused earlier (the recipe schema and the run dir check)."""
    if "\n" in value or "\r" in value:
        raise ValueError(f"#SBATCH value cannot hold a line break: {value!r}")
    if _SBATCH_PLAIN.match(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
