"""The CLI skips pydantic's plugin lookup for itself, but what it starts keeps the user's environment."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pydantic

from slurmrl import pydantic_plugins
from slurmrl.slurm import tools

ROOT = Path(__file__).resolve().parent.parent
LOADER_IMPORT = re.compile(r"from (?:\.|pydantic\.plugin\.)_loader import \(?([\w, ]+)")


def test_children_do_not_inherit_the_switch(monkeypatch):
    monkeypatch.delenv(pydantic_plugins.VAR, raising=False)
    monkeypatch.setattr(pydantic_plugins, "_set_here", False)
    pydantic_plugins.skip_lookup()
    try:
        assert os.environ[pydantic_plugins.VAR] == "__all__"
        out = tools.call(["env"]).stdout
        assert pydantic_plugins.VAR not in out
    finally:
        os.environ.pop(pydantic_plugins.VAR, None)
        pydantic_plugins._set_here = False


def test_a_users_own_setting_is_kept(monkeypatch):
    monkeypatch.setenv(pydantic_plugins.VAR, "logfire")
    monkeypatch.setattr(pydantic_plugins, "_set_here", False)
    pydantic_plugins.skip_lookup()
    assert os.environ[pydantic_plugins.VAR] == "logfire"
    assert pydantic_plugins.child_env() is None
    assert "PYDANTIC_DISABLE_PLUGINS=logfire" in tools.call(["env"]).stdout


def test_the_stand_in_loader_answers_as_pydantics_own_does(monkeypatch):
    """With plugins off, pydantic's own loader finds no plugin, and the stand-in for it (which `slurmrl plan`
    imports in its place, see slurmrl.pydantic_plugins) says the same; pydantic asks its loader for nothing else."""
    source = Path(pydantic.__file__).parent / "plugin" / "_loader.py"  # pydantic's own, not what sys.modules holds
    spec = importlib.util.spec_from_file_location(pydantic_plugins.LOADER, source)
    assert spec is not None and spec.loader is not None
    _loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(_loader)
    assert pydantic_plugins.no_plugins_loader().get_plugins() == ()
    for value in pydantic_plugins.OFF:
        monkeypatch.setenv(pydantic_plugins.VAR, value)
        assert tuple(_loader.get_plugins()) == ()
    monkeypatch.setenv(pydantic_plugins.VAR, "some_plugin")  # the other side: a name is not "all off"
    assert "some_plugin" not in pydantic_plugins.OFF
    asked: set[str] = set()
    for source in Path(pydantic.__file__).parent.rglob("*.py"):
        for names in LOADER_IMPORT.findall(source.read_text()):
            asked |= {n.strip() for n in names.split(",")}
    assert asked == {"get_plugins"}


def test_a_name_the_stand_in_lacks_brings_pydantics_own_loader_back(monkeypatch):
    """A newer pydantic asking its loader for more than ``get_plugins``: the stand-in gives way to the real one."""
    stand_in = pydantic_plugins.no_plugins_loader()
    monkeypatch.setitem(sys.modules, pydantic_plugins.LOADER, stand_in)
    real = stand_in.__getattr__("get_plugins")  # what `from ._loader import get_plugins` would do once absent
    assert sys.modules[pydantic_plugins.LOADER] is not stand_in
    assert real is sys.modules[pydantic_plugins.LOADER].get_plugins and real is not stand_in.get_plugins
    monkeypatch.setitem(sys.modules, pydantic_plugins.LOADER, stand_in)
    namespace: dict = {}
    exec(f"from {pydantic_plugins.LOADER} import _plugins", namespace)  # a name only the real one has
    assert namespace["_plugins"] is sys.modules[pydantic_plugins.LOADER]._plugins


def test_a_plan_loads_no_package_metadata():
    """`slurmrl plan` in a fresh process: pydantic's loader is the stand-in, so importlib.metadata is never
    imported, and the plan is made (its models built and validated)."""
    code = ("import contextlib, io, sys\nfrom slurmrl import cli\nwith contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    assert cli.main(['plan', 'recipes/rl-debug.toml']) == 0\n"
            "print('importlib.metadata' in sys.modules, type(sys.modules['pydantic.plugin._loader'].__spec__).__name__, "
            "'trainer' in out.getvalue())")
    env = {k: v for k, v in os.environ.items() if k != pydantic_plugins.VAR}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "NoneType", "True"]
