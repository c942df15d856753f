"""recipe file -> plan -> run dir. Shared by `plan`, `render`, `diff` and `submit`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.plan import Plan, plan
from slurmrl.recipe.load import load_recipe
from slurmrl.recipe.schema import Recipe
from slurmrl.rundir import lockfile, tomlw
from slurmrl.rundir.lockfile import recorded_source
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.write import write_run_dir


@dataclass(frozen=True)
class Rendered:
    recipe: Recipe
    plan: Plan
    run_dir: Path
    files: dict[str, str]  # relative path -> text

    @property
    def script(self) -> str:
        return self.files[RunDir.SCRIPT]


def resolve_run_dir(recipe: Recipe, preflight: bool = False) -> Path:
    """``output_dir`` is relative to the current directory, like any command-line path."""
    return (Path(recipe.output_dir) / (f"{recipe.name}-preflight" if preflight else recipe.name)).resolve()


def check_run_dir(recipe: Recipe, run_dir: Path) -> None:
    """The run dir path goes into comments, #SBATCH lines and Pyxis' mount list."""
    text = str(run_dir)
    if "\n" in text or "\r" in text:
        raise UserError("output_dir", f"the run dir {text!r} cannot hold a line break")
    if recipe.container is not None and ("," in text or ":" in text):
        raise UserError("output_dir", f"the run dir {text!r} is mounted into the container; it cannot hold ',' or ':'")


def templates_dir(recipe: Recipe, recipe_path: Path) -> Path | None:
    if not recipe.templates_dir:
        return None
    path = (recipe_path.parent / recipe.templates_dir).resolve()
    if not (path / "job.sbatch.j2").is_file():
        raise UserError("templates_dir", f"{path} has no job.sbatch.j2; create it with `slurmrl templates eject DIR`")
    return path


def component_config(c, run_dir: Path) -> str:
    """components/<name>.toml: the typed settings of one of our own programs (trainer, orchestrator)."""
    return tomlw.dumps(c.settings)


def resolved_recipe(recipe: Recipe, recipe_path: Path) -> dict:
    """The recipe as data, with paths that were relative to the recipe file made absolute."""
    data = recipe.model_dump(exclude_none=True)
    if recipe.templates_dir:
        data["templates_dir"] = str((recipe_path.parent / recipe.templates_dir).resolve())
    return data


def plan_json(p: Plan) -> str:
    return p.model_dump_json(indent=1) + "\n"


def planned(
    recipe_path: str | Path,
    overrides: list[str] = (),
    run_dir: str | Path | None = None,
    preflight: bool = False,
    place=None,
) -> tuple[Recipe, Plan, Path]:
    """Load, check and plan, rendering nothing (`slurmrl plan`). Raises UserError on bad input.
    ``place``: where the job sees the run dir, from its path here (submit --cluster: on the cluster)."""
    recipe_path = Path(recipe_path)
    recipe = load_recipe(recipe_path, overrides)
    run_dir = Path(run_dir).resolve() if run_dir else resolve_run_dir(recipe, preflight)
    run_dir = place(run_dir) if place else run_dir
    check_run_dir(recipe, run_dir)
    p = plan(recipe, str(run_dir), preflight=preflight)
    templates_dir(recipe, recipe_path)  # a missing templates_dir is bad input for `plan` too
    return recipe, p, run_dir


def build(
    recipe_path: str | Path,
    overrides: list[str] = (),
    run_dir: str | Path | None = None,
    preflight: bool = False,
    source_name: str | None = None,
    place=None,
) -> Rendered:
    """Everything `render` would write, in memory. Raises UserError on bad input.

    ``source_name``: the recipe file named in the script's header (default: ``recipe_path``'s name;
    `slurmrl diff` re-renders a run dir's recipe.toml under the name it was first rendered from)."""
    from slurmrl.render.script import render_script  # jinja2: only when rendering

    recipe_path = Path(recipe_path)
    recipe, p, run_dir = planned(recipe_path, overrides, run_dir, preflight, place)
    files = {
        RunDir.SCRIPT: render_script(p, str(run_dir), source_name or recorded_source(recipe_path) or recipe_path.name,
                                    templates_dir(recipe, recipe_path)),
        RunDir.PLAN: plan_json(p),
        RunDir.RECIPE: "# The recipe as resolved (overrides applied, defaults filled in).\n"
        + tomlw.dumps(resolved_recipe(recipe, recipe_path)),
    }
    for c in p.components:
        if c.settings is not None:
            files[f"{RunDir.COMPONENTS}/{c.name}.toml"] = component_config(c, run_dir)
    return Rendered(recipe, p, run_dir, files)


def render(
    recipe_path: str | Path,
    overrides: list[str] = (),
    force: bool = False,
    run_dir: str | Path | None = None,
    preflight: bool = False,
) -> Rendered:
    out = build(recipe_path, overrides, run_dir, preflight)
    out = Rendered(out.recipe, out.plan, out.run_dir, {**out.files, RunDir.LOCK: lock_text(out, recipe_path)})
    write_run_dir(out.run_dir, out.files, force=force)
    return out


def lock_text(out: Rendered, recipe_path: str | Path, **links) -> str:
    """RUN_DIR/lock.toml for what ``build`` rendered from ``recipe_path`` (slurmrl.rundir.lockfile)."""
    source = lockfile.header_source(out.script) or Path(recipe_path).name
    return lockfile.compose(out.files[RunDir.RECIPE], out.files, out.run_dir, source=source,
                        preflight=out.plan.preflight, recipe_path=Path(recipe_path), edited=False, **links)
