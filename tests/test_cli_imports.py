"""The CLI imports only what the verb needs (start-up time; issue 33): `slurmrl plan` of every gallery
recipe, in a fresh process, loads no torch, transformers or vLLM, no template engine, no Slurm code, and
none of the other verbs' modules (the sweep grid, the lock file, the run-dir writer). What it loads is
read from that process's ``sys.modules``: no timing here (benchmarks/plan_bench.py measures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from slurmrl.recipe.inference import VllmInference
from slurmrl.recipe.judge import Judge
from slurmrl.recipe.load import load_recipe
from slurmrl.recipe.recipe import Recipe

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
         "slurmrl.runtime", "slurmrl.render.script", "slurmrl.remote",
         "slurmrl.envs.verifiers_v1", "slurmrl.contract.envwire",  # a v1 taskset's worker and its wire
         "importlib.metadata")  # pydantic's plugin loader's (slurmrl.pydantic_plugins)


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



def models_in(schema) -> set[str]:
    """The names of the models a pydantic core schema holds (its own, nested and in definitions)."""
    found, todo = set(), [schema]
    while todo:
        s = todo.pop()
        if isinstance(s, dict):
            if s.get("type") == "model":
                found.add(s["cls"].__name__)
            todo += list(s.values())
        elif isinstance(s, list):
            todo += s
    return found


def test_the_recipe_schema_leaves_out_the_optional_sections():
    """The recipe's own schema holds its always-there sections, not the optional ones most recipes leave out
    (slurmrl.recipe.schema.OnDemand: built when a recipe holds one), nor the engines' [inference] sections;
    a recipe that holds one validates it."""
    recipe = load_recipe(ROOT / "slurmrl" / "recipes" / "rl-judge.toml")
    held = models_in(Recipe.__pydantic_core_schema__)
    assert {"Recipe", "Slurm", "Trainer", "Orchestrator"} <= held
    assert not held & {"Benchmark", "Judge", "Eval", "Sweep", "Collector", "Container", "VllmInference",
                       "DynamoInference", "SglangInference"}
    assert isinstance(recipe.judge, Judge) and Judge.__pydantic_complete__
    assert isinstance(recipe.inference, VllmInference) and VllmInference.__pydantic_complete__
