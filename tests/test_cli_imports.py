"""The CLI imports only what the verb needs (start-up time; issue 33): `slurmrl plan` of every gallery
recipe, in a fresh process, loads no torch, transformers or vLLM, no template engine, no Slurm code, and
none of the other verbs' modules (the sweep grid, the lock file, the run-dir writer). What it loads is
read from that process's ``sys.modules``: no timing here (benchmarks/plan_bench.py measures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GALLERY = sorted((ROOT / "slurmrl" / "recipes").glob("*.toml"))

# `python -m slurmrl plan RECIPE` is slurmrl.cli.main(["plan", RECIPE]); each recipe in turn, then the modules
PLAN_EVERY_RECIPE = """
import contextlib, io, json, sys
from slurmrl import cli
for recipe in sys.argv[1:]:
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["plan", recipe]) == 0, recipe
print(json.dumps(sorted(sys.modules)))
"""

NEVER = ("torch", "transformers", "vllm", "jinja2", "slurmrl.app.sweep_grid", "slurmrl.app.build",
         "slurmrl.app.keep_edits", "slurmrl.rundir.lockfile", "slurmrl.rundir.write", "slurmrl.slurm",
         "slurmrl.runtime", "slurmrl.render.script", "slurmrl.remote")


def modules_after(code: str, *args: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_plan_imports_only_what_planning_needs():
    assert len(GALLERY) > 20
    mods = modules_after(PLAN_EVERY_RECIPE, *map(str, GALLERY))
    assert "slurmrl.app.plan" in mods and "slurmrl.plan.planner" in mods  # it did plan
    loaded = sorted(m for m in mods if any(m == n or m.startswith(n + ".") for n in NEVER))
    assert not loaded, f"`slurmrl plan` imports {loaded}"


def test_render_still_loads_what_it_writes_with():
    """The other side: the module list above is not empty by accident (render loads the template engine)."""
    code = PLAN_EVERY_RECIPE.replace('cli.main(["plan", recipe])', 'cli.main(["render", recipe, "--stdout"])')
    mods = modules_after(code, str(GALLERY[0]))
    assert {"jinja2", "slurmrl.app.build", "slurmrl.rundir.lockfile"} <= mods
