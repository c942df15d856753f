"""Plan and runtime share only leaves (the port table, the environments, the run-dir layout,
the settings models): neither imports the other, and the supervisor starts without pydantic."""

from __future__ import annotations

import subprocess
import sys

import pytest


def loaded_after(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


@pytest.mark.parametrize("module", ["slurmrl.runtime.steps.supervise", "slurmrl.runtime.steps.probe"])
def test_step_programs_import_no_planner_and_no_pydantic(module):
    mods = loaded_after(module)
    assert not {m for m in mods if m.startswith(("slurmrl.plan", "slurmrl.render", "slurmrl.recipe", "pydantic"))}


def test_planner_imports_no_runtime():
    mods = loaded_after("slurmrl.plan")
    assert not {m for m in mods if m.startswith("slurmrl.runtime")}
    assert {"slurmrl.ports", "slurmrl.envs"} <= mods
