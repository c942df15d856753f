"""The dry run: recipe file -> Recipe -> plan (``slurmrl.app.plan``) -> run dir files, in memory, then
written only when every check passed. `slurmrl init`, `validate`, `render` and `templates eject`; `diff`,
`submit`, `sweep` and `submit --again` build through here too."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slurmrl.app import sweep_grid
from slurmrl.app.keep_edits import refuse_lost_edits
from slurmrl.app.plan import plan_json, plan_recipe, templates_dir, warn
from slurmrl.contract import slurmrl_check
from slurmrl.errors import UserError
from slurmrl.plan import Plan
from slurmrl.plan.model import RoleSettings, dump_settings
from slurmrl.recipe.load import load_recipe
from slurmrl.recipe.recipe import Recipe
from slurmrl.rundir import lockfile as lock
from slurmrl.rundir import tomlw
from slurmrl.rundir.atomic import write_text
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.write import write_run_dir

STARTERS = Path(__file__).resolve().parent.parent / "recipes"  # `slurmrl init SHAPE` (cli.py lists them in --help)


@dataclass(frozen=True)
class Rendered:
    recipe: Recipe
    plan: Plan
    run_dir: Path
    files: dict[str, str]  # relative path -> text

    @property
    def script(self) -> str:
        return self.files[RunDir.SCRIPT]


def component_config(settings: RoleSettings) -> str:
    """components/<name>.toml: the typed settings of one of our own programs (trainer, orchestrator)."""
    return tomlw.dumps(dump_settings(settings))


def resolved_recipe(recipe: Recipe, recipe_path: Path) -> dict:
    """The recipe as data, with paths that were relative to the recipe file made absolute."""
    data = recipe.model_dump(exclude_none=True)
    if recipe.templates_dir:
        data["templates_dir"] = str((recipe_path.parent / recipe.templates_dir).resolve())
    return data


def build(
    recipe_path: str | Path,
    overrides: Sequence[str] = (),
    run_dir: str | Path | None = None,
    preflight: bool = False,
    source_name: str | None = None,
    place=None,
) -> Rendered:
    """Everything `render` would write, in memory. Raises UserError on bad input.

    ``source_name``: the recipe file named in the script's header (default: ``recipe_path``'s name;
    `slurmrl diff` re-renders a run dir's recipe.toml under the name it was first rendered from)."""
    recipe_path = Path(recipe_path)
    recipe = load_recipe(recipe_path, overrides)
    source = source_name or lock.recorded_source(recipe_path) or recipe_path.name
    return build_recipe(recipe, recipe_path, run_dir, preflight, source, place)


def build_recipe(recipe: Recipe, recipe_path: Path, run_dir: str | Path | None = None, preflight: bool = False,
                 source_name: str | None = None, place=None, join: str | None = None) -> Rendered:
    """``build`` for a Recipe already loaded from ``recipe_path`` (a sweep's points: one load, many recipes);
    ``join``: a joiner job's (slurmrl.app.join)."""
    from slurmrl.render.script import FUNCTIONS, render_functions, render_script  # jinja2: only when rendering

    recipe_path = Path(recipe_path)
    p, run_dir = plan_recipe(recipe, recipe_path, run_dir, preflight, place, join)
    files = {
        RunDir.SCRIPT: render_script(p, str(run_dir), source_name or recipe_path.name,
                                    templates_dir(recipe, recipe_path)),
        FUNCTIONS: render_functions(templates_dir(recipe, recipe_path)),
        RunDir.PLAN: plan_json(p),
        RunDir.RECIPE: "# The recipe as resolved (overrides applied, defaults filled in).\n"
        + tomlw.dumps(resolved_recipe(recipe, recipe_path)),
    }
    if p.slurmrl_check is not None:  # the job's first step runs it in the container (slurmrl.contract.slurmrl_check)
        files[RunDir.SLURMRL_CHECK] = Path(slurmrl_check.__file__).read_text(encoding="utf-8")
    for c in p.components:
        if c.settings is not None:
            files[f"{RunDir.COMPONENTS}/{c.name}.toml"] = component_config(c.settings)
    return Rendered(recipe, p, run_dir, files)


def render(
    recipe_path: str | Path,
    overrides: Sequence[str] = (),
    force: bool = False,
    run_dir: str | Path | None = None,
    preflight: bool = False,
) -> Rendered:
    out = build(recipe_path, overrides, run_dir, preflight)
    if not force:
        refuse_lost_edits(out.run_dir, out.files, build)  # no hand edit is lost without --force
    out = Rendered(out.recipe, out.plan, out.run_dir, {**out.files, RunDir.LOCK: lock_text(out, recipe_path)})
    write_run_dir(out.run_dir, out.files, force=force)
    return out


def lock_text(out: Rendered, recipe_path: str | Path, **links) -> str:
    """RUN_DIR/lock.toml for what ``build`` rendered from ``recipe_path`` (slurmrl.lock)."""
    source = lock.header_source(out.script) or Path(recipe_path).name
    return lock.compose(out.files[RunDir.RECIPE], out.files, out.run_dir, source=source,
                        preflight=out.plan.preflight, recipe_path=Path(recipe_path), edited=False, **links)


def starters() -> list[str]:
    return sorted(p.stem for p in STARTERS.glob("*.toml"))


# ---- the verbs ------------------------------------------------------------------------------------
def cmd_init(args) -> int:
    if args.shape not in starters():
        raise UserError("shape", f"unknown shape {args.shape!r}; choose one of: {', '.join(starters())}")
    text = (STARTERS / f"{args.shape}.toml").read_text()
    if not args.output:
        sys.stdout.write(text)
        return 0
    out = Path(args.output)
    if out.exists() or out.is_symlink():
        raise UserError(str(out), "exists; choose another file name")
    write_text(out, text, umask=None)  # its folder looked at first; nothing half-written
    print(out)
    return 0


def cmd_validate(args) -> int:
    warn(validate(args.recipe, args.overrides))
    return 0  # a good recipe prints nothing: `slurmrl validate x.toml && ...`


def validate(recipe_path: str | Path, overrides: Sequence[str] = ()) -> list[str]:
    """Check a recipe as `render` would (every point of its [sweep] grid, when it has one), writing
    nothing; returns the warnings (each once). Raises UserError on bad input."""
    recipe_path = Path(recipe_path)
    data = sweep_grid.read_recipe_data(recipe_path, overrides)
    if "sweep" not in data:
        return list(build(recipe_path, list(overrides)).plan.warnings)
    warnings: list[str] = []
    for i, combo, recipe in sweep_grid.point_recipes(data, [], empty_ok=True):
        try:
            found = build_recipe(recipe, recipe_path, source_name=recipe_path.name).plan.warnings
        except UserError as e:
            raise UserError(e.field, f"{e.message} ({sweep_grid.where(i, combo)})") from None
        for w in found:
            if w not in warnings:
                warnings.append(w)
    return warnings


def cmd_render(args) -> int:
    if args.stdout:
        out = build(args.recipe, args.overrides, args.run_dir, args.preflight)
        warn(out.plan.warnings)
        print(out.script, end="")
        return 0
    out = render(args.recipe, args.overrides, force=args.force, run_dir=args.run_dir, preflight=args.preflight)
    warn(out.plan.warnings)
    print(out.run_dir)
    return 0


def cmd_templates(args) -> int:
    from slurmrl.render.script import PACKAGE_TEMPLATES  # jinja2: only for this verb

    dest = Path(args.dir)
    if dest.exists() and any(dest.iterdir()):
        raise UserError(str(dest), "exists and is not empty; eject into a new folder")
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted(PACKAGE_TEMPLATES.glob("*.j2")):
        shutil.copy2(f, dest / f.name)
    print(f"{dest}: set templates_dir = {str(dest.resolve())!r} in your recipe to render with these")
    return 0
