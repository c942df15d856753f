"""Shell words the planner writes into task functions: port-table references, per-task
arithmetic, JSON arguments with run-time pieces, and the paths of console scripts.

Everything here is planner text (``Sh``) built from names and numbers; user text stays ``str``
and is single-quoted by the renderer's one quoting filter.
"""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath

from slurmrl import ports
from slurmrl.plan.model import Cat, Sh

HOST = Sh(sh="${host}")  # the task's own hostname (prelude: host=$(hostname))
HOST_LINE = "host=$(hostname)"


def declare(*names: str, arrays: tuple[str, ...] = ()) -> list[str]:
    """``local`` lines for a task function's variables."""
    out = [f"local {' '.join(names)}"] if names else []
    return out + ([f"local -a {' '.join(arrays)}"] if arrays else [])


def var(name: str) -> Sh:
    """A port-table variable, e.g. ``${PORT_ROUTER}``."""
    ports.offset(name)  # fails early on a name the table does not have
    return Sh(sh="${%s}" % ports.shell_var(name))


def head(group: int) -> Sh:
    """The first node of a het group (the script exports HEAD_G<n>)."""
    return Sh(sh="${HEAD_G%d}" % group)


def per_task(block: str, first: int = 0, step: int = 1, less: str = "") -> str:
    """Arithmetic for this task's entry in a per-node port block: block_<first + LOCALID*step>,
    minus the shell variable ``less`` when given."""
    base = ports.shell_var(f"{block}_0")
    offset = f"{first} + " if first else ""
    times = f" * {step}" if step != 1 else ""
    minus = f" - {less}" if less else ""
    return f"$(({base} + {offset}SLURM_LOCALID{times}{minus}))"


def gpu_slice(first: int, count: int, per_task: bool) -> str | Sh:
    """``FIRST:COUNT`` GPU positions for the supervisor; ``per_task``: task k of a node takes the
    k-th slice (so editing ``--ntasks-per-node`` moves the slices along)."""
    if not per_task:
        return f"{first}:{count}"
    offset = f"{first} + " if first else ""
    return Sh(sh=f"$(({offset}SLURM_LOCALID * {count})):{count}")


def url(scheme: str, port: Sh) -> Sh:
    return Sh(sh=f"{scheme}://${{host}}:{port.sh}")


def json_word(obj) -> Cat:
    """A JSON document as one shell word; ``Sh`` leaves are spliced in as JSON strings."""
    pieces: list[Sh] = []
    tag = "@sh"
    while tag in json.dumps(obj, default=lambda o: ""):  # a marker no user text holds
        tag = "@" + tag

    def default(o):
        if isinstance(o, Sh):
            pieces.append(o)
            return f"{tag}{len(pieces) - 1}{tag}"
        raise TypeError(type(o).__name__)

    text = json.dumps(obj, separators=(",", ":"), default=default)
    parts: list[str | Sh] = []
    for i, chunk in enumerate(re.split(f'"{re.escape(tag)}(\\d+){re.escape(tag)}"', text)):
        if i % 2:
            parts += ['"', pieces[int(chunk)], '"']
        elif chunk:
            parts.append(chunk)
    return Cat(parts=tuple(parts))


def tool(python: tuple[str, ...], name: str) -> tuple[str, ...]:
    """How to run a console script from the job's Python environment: through ``uv run``,
    beside an interpreter given by path (a venv's bin/), or by name on PATH (a container)."""
    if python[0] == "uv":
        return (*python[:-1], name)
    exe = python[0]
    if "/" in exe:
        return (str(PurePosixPath(exe).parent / name),)
    return (name,)


_PORT_REF = re.compile(r"\bPORT_([A-Z0-9_]+)\b")


def port_refs(text: str) -> set[str]:
    """Port-table names a piece of planner shell refers to (``${PORT_SERVER_0}`` -> server_0)."""
    return {m.lower() for m in _PORT_REF.findall(text)}
