"""The one shell-quoting filter. Every value that reaches bash in a rendered script goes through ``shq``."""

from __future__ import annotations

import re
import shlex

from slurmrl.plan.model import Cat, Sh


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
    if isinstance(value, Cat):  # adjacent quoted pieces make one word
        return "".join(shq(part) for part in value.parts if part != "") or "''"
    if isinstance(value, bool):
        value = "true" if value else "false"
    return shlex.quote(str(value))


def shjoin(values) -> str:
    return " ".join(shq(v) for v in values)


def _is_option(value) -> bool:
    """An ``--option``, or a planner array of options (``"${pools[@]}"``)."""
    if isinstance(value, Sh):
        return value.sh.startswith("--") or (value.sh.startswith("${") and value.sh.endswith("[@]}"))
    return isinstance(value, str) and value.startswith("--") and len(value) > 2


def shlines(values, indent: str) -> str:
    """``shjoin``, with a line break before each ``--option`` (and a ``-m MODULE`` after the
    program): one flag and its value per line, so a person edits a command line a flag at a time."""
    words = [shq(v) for v in values]
    out = ""
    for i, (value, word) in enumerate(zip(values, words)):
        if i and values[i - 1] == "--":  # a wrapper's `--`: the command it runs starts a line
            out += " \\\n" + indent
        elif i and (_is_option(value) or (value == "-m" and i > 1)):
            out += " \\\n" + indent
        elif i:
            out += " "
        out += word
    return out


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
