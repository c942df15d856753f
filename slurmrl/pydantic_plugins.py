"""slurmrl's CLI uses no pydantic plugin, and looking them up costs ~50 ms a command: pydantic
scans the entry points of every installed package the first time it builds a model. The CLI
skips that lookup, and keeps the switch out of what it starts (sbatch passes its environment to
the job, where a user's code may want its plugins).
"""

from __future__ import annotations

import os

VAR = "PYDANTIC_DISABLE_PLUGINS"
_set_here = False


def skip_lookup() -> None:
    """Tell pydantic to load no plugins in this process, unless the user already said something."""
    global _set_here
    if VAR not in os.environ:
        os.environ[VAR] = "__all__"
        _set_here = True


def child_env() -> dict[str, str] | None:
    """The environment for a child process: ours, without the switch when we set it (None: inherit)."""
    if not _set_here:
        return None
    return {k: v for k, v in os.environ.items() if k != VAR}
