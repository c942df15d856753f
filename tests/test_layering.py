"""Plan and runtime share only leaves (the port table, the environments, the run-dir layout,
the settings models): neither imports the other, the supervisor starts without pydantic, and
runtime/ imports nothing above it (read from the source with ``ast``, imports in functions too)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


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


# ---- runtime/: what runs inside job steps imports only what it reads, never the planner's side ----
RUNTIME = ROOT / "slurmrl" / "runtime"
RUNTIME_MAY_IMPORT = ("slurmrl.runtime", "slurmrl.settings", "slurmrl.rundir", "slurmrl.charts", "slurmrl.envs",
                      "slurmrl.ports", "slurmrl.secret", "slurmrl.heartbeat", "slurmrl.errors")


def first_party_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every slurmrl import in ``path``, those inside functions included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "slurmrl":
            names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "slurmrl" else [node.module]
            out += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "slurmrl"]
    return out


def test_runtime_imports_only_settings_rundir_and_leaves():
    bad = [f"{p.relative_to(ROOT)}:{line}: {mod}" for p in sorted(RUNTIME.rglob("*.py"))
           for line, mod in first_party_imports(p)
           if not any(mod == ok or mod.startswith(ok + ".") for ok in RUNTIME_MAY_IMPORT)]
    assert not bad, "runtime/ imports recipe/plan/render/slurm/app (move the piece down):\n" + "\n".join(bad)


def test_fixtures_are_not_part_of_a_job():
    users = [f"{p.relative_to(ROOT)}:{line}" for p in sorted(RUNTIME.rglob("*.py"))
             if "fixtures" not in p.parts for line, mod in first_party_imports(p) if ".fixtures" in mod]
    assert not users


def test_only_the_vllm_client_speaks_http_to_vllm():
    """One client for vLLM's routes (secret, timeouts, errors in one place); the auth gate is a proxy (aiohttp)."""
    speakers = sorted(str(p.relative_to(RUNTIME)) for p in RUNTIME.rglob("*.py")
                      if any(w in p.read_text() for w in ("import urllib.request", "import http.client")))
    assert speakers == ["vllm/client.py"]
