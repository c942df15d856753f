"""slurmrl's CLI uses no pydantic plugin, and looking them up costs ~50 ms a command: pydantic
scans the entry points of every installed package the first time it builds a model. The CLI
skips that lookup, and keeps the switch out of what it starts (sbatch passes its environment to
the job, where a user's code may want its plugins).

With every plugin off, pydantic's loader (``pydantic.plugin._loader``) answers ``()`` without looking,
but importing it still costs ~10 ms of a `slurmrl plan` (it imports ``importlib.metadata``, which brings
``email``, ``zipfile`` and ``csv``). So where plugins are off in this process, a module with the loader's
one function, answering the same ``()``, stands in for it. ``tests/test_pydantic_plugins.py`` checks that
pydantic imports nothing else from its loader and that its own loader answers ``()`` too; a name the
stand-in lacks (a newer pydantic's) brings pydantic's own loader back instead of failing.
"""

from __future__ import annotations

import importlib
import os
import sys
import types

VAR = "PYDANTIC_DISABLE_PLUGINS"
OFF = ("__all__", "1", "true")  # the values of VAR that turn every plugin off (pydantic.plugin._loader)
LOADER = "pydantic.plugin._loader"
_set_here = False


def skip_lookup() -> None:
    """Tell pydantic to load no plugins in this process, unless the user already said something."""
    global _set_here
    if VAR not in os.environ:
        os.environ[VAR] = "__all__"
        _set_here = True
    if os.environ[VAR] in OFF:
        sys.modules.setdefault(LOADER, no_plugins_loader())  # pydantic's own, where already imported, stays


def no_plugins_loader() -> types.ModuleType:
    """What stands in for pydantic's plugin loader while every plugin is off: ``get_plugins()`` is ``()``."""
    module = types.ModuleType(LOADER, "pydantic's plugin loader while every plugin is off (slurmrl.pydantic_plugins)")
    module.get_plugins = _no_plugins  # type: ignore[attr-defined]
    setattr(module, "__getattr__", _the_real_loaders)  # PEP 562: asked for a name the module lacks
    return module


def _the_real_loaders(name: str):
    """A name the stand-in lacks (a pydantic newer than the one tested asks more of its loader): pydantic's
    own loader takes its place from then on and answers. (Dunder names, which the import system asks of
    every module, are simply absent.)"""
    if name.startswith("__"):
        raise AttributeError(name)
    sys.modules.pop(LOADER, None)
    return getattr(importlib.import_module(LOADER), name)


def _no_plugins() -> tuple[()]:
    return ()


def child_env() -> dict[str, str] | None:
    """The environment for a child process: ours, without the switch when we set it (None: inherit)."""
    if not _set_here:
        return None
    return {k: v for k, v in os.environ.items() if k != VAR}
