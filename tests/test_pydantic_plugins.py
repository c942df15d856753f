"""The CLI skips pydantic's plugin lookup for itself, but what it starts keeps the user's environment."""

from __future__ import annotations

import os

from slurmrl import pydantic_plugins
from slurmrl.slurm import tools


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
