"""`slurmrl plan`: load, check and plan a recipe, rendering nothing; every verb that plans (validate,
render, submit, sweep, diff) plans through here. Imports only what planning needs (no template
engine, no run-dir writer, no lock file, no sweep grid): `slurmrl plan` starts fast."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.plan import Plan, plan
from slurmrl.recipe.load import load_recipe
from slurmrl.recipe.recipe import Recipe
from slurmrl.render.summary import salloc_line, summary
from slurmrl.rundir.atomic import folder_problem
from slurmrl.rundir.paths import RunDir
from slurmrl.settings.section import CONTROL


def resolve_run_dir(recipe: Recipe, preflight: bool = False) -> Path:
    """``output_dir`` is relative to the current directory, like any command-line path."""
    return (Path(recipe.output_dir) / (f"{recipe.name}-preflight" if preflight else recipe.name)).resolve()


def check_run_dir(recipe: Recipe, run_dir: Path) -> None:
    """The run dir path goes into comments, #SBATCH lines and Pyxis' mount list; it, and the folders
    above it, are folders or can be made."""
    text = str(run_dir)
    problem = RunDir.pattern_problem(text)
    if problem:
        raise UserError("output_dir", problem)
    control = CONTROL.search(text)  # the rule every recipe string follows: the settings carry the path
    if control:
        raise UserError("output_dir", f"the run dir {text[:80]!r} holds a control character "
                                      f"(U+{ord(control.group()):04X}); remove it")
    blocked = folder_problem(run_dir, writable=False)
    if blocked:
        raise UserError("output_dir", f"{run_dir} cannot be made: {blocked[0]} {blocked[1]}")
    if recipe.container is not None and ("," in text or ":" in text):
        raise UserError("output_dir", f"the run dir {text!r} is mounted into the container; it cannot hold ',' or ':'")


def templates_dir(recipe: Recipe, recipe_path: Path) -> Path | None:
    if not recipe.templates_dir:
        return None
    path = (recipe_path.parent / recipe.templates_dir).resolve()
    if not (path / "job.sbatch.j2").is_file():
        raise UserError("templates_dir", f"{path} has no job.sbatch.j2; create it with `slurmrl templates eject DIR`")
    return path


def plan_json(p: Plan) -> str:
    return p.model_dump_json(indent=1) + "\n"


def planned(
    recipe_path: str | Path,
    overrides: Sequence[str] = (),
    run_dir: str | Path | None = None,
    preflight: bool = False,
    place=None,
) -> tuple[Recipe, Plan, Path]:
    """Load, check and plan, rendering nothing (`slurmrl plan`). Raises UserError on bad input.
    ``place``: where the job sees the run dir, from its path here (submit --cluster: on the cluster)."""
    recipe = load_recipe(recipe_path, overrides)
    p, run_dir = plan_recipe(recipe, Path(recipe_path), run_dir, preflight, place)
    return recipe, p, run_dir


def plan_recipe(recipe: Recipe, recipe_path: Path, run_dir: str | Path | None = None, preflight: bool = False,
                place=None, join: str | None = None) -> tuple[Plan, Path]:
    """Check and plan a Recipe read from ``recipe_path`` (paths in it are relative to that file); ``join``: the
    run dir a joiner job's servers register in (``slurmrl.plan.join``)."""
    run_dir = Path(run_dir).resolve() if run_dir else resolve_run_dir(recipe, preflight)
    run_dir = place(run_dir) if place else run_dir
    check_run_dir(recipe, run_dir)
    p = plan(recipe, str(run_dir), preflight=preflight, join=join)
    templates_dir(recipe, recipe_path)  # a missing templates_dir is bad input for `plan` too
    return p, run_dir


def warn(warnings: Iterable[str]) -> None:
    """The planner's warnings (``Plan.warnings``), each once, on stderr as ``slurmrl: warning: ...``: the
    one place they are printed; every verb that plans (validate, plan, render, submit, sweep) calls it."""
    for w in dict.fromkeys(warnings):
        print(f"slurmrl: warning: {w}", file=sys.stderr, flush=True)


# ---- the verb ------------------------------------------------------------------------------------
def cmd_plan(args) -> int:
    _, p, run_dir = planned(args.recipe, args.overrides, args.run_dir)
    warn(p.warnings)  # on stderr whatever stdout shows (the summary lists them too)
    if args.json:
        print(plan_json(p), end="")  # strict JSON: a plan's numbers are finite (the recipe refuses others)
        return 0
    if not args.salloc:
        print(summary(p, run_dir, args.job_id))
        return 0
    script = RunDir(run_dir).script
    print(salloc_line(p, script))
    if not script.exists():
        print(f"slurmrl: {script} is not rendered yet: run `slurmrl render` with the same recipe and options first",
              file=sys.stderr)
    return 0
