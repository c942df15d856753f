"""`slurmrl sweep RECIPE --grid trainer.lr=1e-6,3e-6 --grid inference.tp=1,2 [--max-running N]`.

One complete, hand-editable run dir per point of the grid (every combination of the values),
under a sweep dir with an index (slurmrl.app.sweep_dir). A recipe may carry the grid in a
``[sweep]`` table (``grid``, ``max_running``); ``--grid`` adds keys or replaces them.

Check everything, then write, then submit: the recipe is read once, every point is validated,
planned and rendered in memory (slurmrl.app.sweep_grid), and the submission is checked (the
cluster can hold each point, the points' dependencies) before the sweep dir is written or
anything is submitted; a bad grid (unknown field, a value of the wrong type, a value twice, no
values) is one line naming the field, and nothing is left behind.

Submitting: as one Slurm job array (``--array=0-N%M``) when every point is a plain job with the same
#SBATCH lines (but job name and output); Slurm refuses a job array of heterogeneous jobs
(22.05: "Invalid job array specification"), and an array has one set of directives, so otherwise
as one job per point, each waiting (``--dependency=afterany``) for the one ``max_running`` before it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from slurmrl.app import sweep_grid
from slurmrl.app.build import build_recipe, lock_text
from slurmrl.app.diff import is_edited
from slurmrl.app.plan import warn
from slurmrl.app.submit import check_in_place, check_not_running, group_names, set_aside
from slurmrl.app.sweep_dir import (
    check_not_submitted,
    default_sweep_dir,
    is_sweep_dir,
    point_dirs,
    read_index,
    write_index,
    write_sweep_dir,
)
from slurmrl.errors import UserError
from slurmrl.recipe.sweep import MAX_SWEEP_POINTS
from slurmrl.render.quoting import sbatch_value, shq
from slurmrl.rundir import jobs, lockfile
from slurmrl.rundir.atomic import folder_problem, missing_folders, remove_empty, write_text
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import read_text
from slurmrl.rundir.text import is_one_line
from slurmrl.rundir.undo import Changes
from slurmrl.slurm import fit, tools
from slurmrl.slurm.sbatch import sbatch
from slurmrl.slurm.script import SHORT, read_groups

ARRAY_OWN = ("--job-name", "--output", "--error", "--array")  # what the array script sets itself


def max_running_arg(text: str | None) -> int | None:
    """--max-running N: the [sweep] table's max_running range, one line (exit 2) for anything else."""
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise UserError("--max-running", f"needs a number of jobs, not {text!r}") from None
    if not 1 <= value <= MAX_SWEEP_POINTS:
        raise UserError("--max-running", f"{text!r} is out of range (1 to {MAX_SWEEP_POINTS})")
    return value


# ---- rendering (in memory) ---------------------------------------------------------------------
@dataclass
class RenderedSweep:
    """A sweep rendered in memory: nothing of it is on disk yet."""

    sweep_dir: Path
    points: dict[str, dict[str, str]]  # point name -> its run dir's files (relative path -> text)
    groups: dict[str, list[str]]  # point name -> its het groups' names
    index: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # every point's plan warnings, each once


def render_points(recipe_path: str | Path, grid_items: list[str], overrides: Sequence[str] = (),
                  max_running: int | None = None, sweep_dir: str | Path | None = None) -> RenderedSweep:
    """Read the recipe once; validate, plan and render every point in memory. Raises UserError on any
    point's error (naming the point) before anything is written."""
    recipe_path = Path(recipe_path)
    data = sweep_grid.read_recipe_data(recipe_path, overrides)
    base, grid = sweep_grid.grid_of(data, grid_items)
    out_dir = Path(sweep_dir).resolve() if sweep_dir else default_sweep_dir(base.output_dir, base.name)
    problem = RunDir.pattern_problem(out_dir)
    blocked = folder_problem(out_dir, writable=False)
    if problem or blocked:
        raise UserError("--sweep-dir" if sweep_dir else "output_dir",
                        problem or f"{out_dir} cannot be made: {' '.join(map(str, blocked or ()))}")
    check_not_submitted(out_dir)
    max_running = max_running or (base.sweep.max_running if base.sweep else None)
    rendered: dict[str, dict[str, str]] = {}
    groups: dict[str, list[str]] = {}
    entries = []
    warnings: dict[str, None] = {}
    for i, combo, recipe in sweep_grid.point_recipes(data, grid_items, name_dir=out_dir):
        name = recipe.name
        try:
            out = build_recipe(recipe, recipe_path, run_dir=out_dir / name, source_name=recipe_path.name)
        except UserError as e:
            raise UserError(e.field, f"{e.message} ({sweep_grid.where(i, combo)})") from None
        except TypeError as e:  # a TOML date or time the writer cannot carry
            raise UserError(next(iter(combo)), f"cannot be swept here: {e}") from None
        warnings.update(dict.fromkeys(out.plan.warnings))
        files = dict(out.files)
        files[RunDir.LOCK] = lock_text(out, recipe_path, sweep=str(out_dir), sweep_point=i)
        files[RunDir.LINKS] = json.dumps({"sweep": str(out_dir)}, indent=1) + "\n"
        rendered[name] = files
        groups[name] = [g.name for g in out.plan.groups]
        values = {k: json.loads(json.dumps(v, default=str)) for k, v in combo.items()}
        entries.append({"index": i, "name": name, "run_dir": str(out_dir / name), "values": values,
                        "groups": len(out.plan.groups)})
    index = {
        "format": 1,
        "name": base.name,
        "recipe": str(recipe_path.resolve()),
        "overrides": list(overrides),
        "grid": {k: json.loads(json.dumps(vs, default=str)) for k, vs in grid.items()},
        "max_running": max_running,
        "rendered_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "points": entries,
        "submissions": [],
    }
    return RenderedSweep(out_dir, rendered, groups, index, list(warnings))


def render_sweep(recipe_path: str | Path, grid_items: list[str], overrides: Sequence[str] = (),
                 max_running: int | None = None, sweep_dir: str | Path | None = None) -> Path:
    """Validate and render every point, then write the sweep dir at once (nothing on any error)."""
    sweep = render_points(recipe_path, grid_items, overrides, max_running, sweep_dir)
    write_sweep_dir(sweep.sweep_dir, sweep.points, sweep.index)
    return sweep.sweep_dir


# ---- submitting ------------------------------------------------------------------------------
def directives(script_text: str, where: str) -> list[dict[str, str]]:
    return [g.options for g in read_groups(script_text, where)]


def array_refusal(scripts: dict[str, str]) -> str | None:
    """Why the points cannot be one job array (None: they can)."""
    shapes = []
    for name, text in scripts.items():
        groups = directives(text, f"{name}/{RunDir.SCRIPT}")
        if len(groups) > 1:
            return (f"{name} is a heterogeneous job ({len(groups)} het groups): Slurm refuses a job array of "
                    "heterogeneous jobs")
        shapes.append({k: v for k, v in groups[0].items() if k not in ARRAY_OWN})
    if any(s != shapes[0] for s in shapes[1:]):
        return "the points ask for different resources (#SBATCH lines), and a job array has one set"
    return None


def sbatch_lines(script_text: str) -> list[str]:
    """The script's #SBATCH lines, as written (sbatch stops at the first command)."""
    out = []
    for n, line in enumerate(script_text.splitlines()):
        s = line.strip()
        if n == 0 and s.startswith("#!"):
            continue
        if s and not s.startswith("#"):
            break
        if s.startswith("#SBATCH"):
            out.append(s)
    return out


def array_script(sweep_dir: Path, index: dict, first_script: str, max_running: int | None) -> str:
    n = len(index["points"])
    own = set(ARRAY_OWN) | {k for k, v in SHORT.items() if v in ARRAY_OWN}
    kept = [line for line in sbatch_lines(first_script)
            if line.split()[1:2] and line.split()[1].split("=")[0] not in own]
    problem = RunDir.pattern_problem(sweep_dir) if is_one_line(str(sweep_dir)) else "it cannot hold a line break"
    if problem:
        raise UserError("--sweep-dir", problem)
    pattern = RunDir(sweep_dir / f"{index['name']}-p%a").array_batch_log_pattern()
    lines = [
        "#!/bin/bash",
        f"# slurmrl sweep {index['name']}: {n} point(s), one job array; array task I runs point I's job.sbatch",
        "# as it is (every point asks for the same resources; their #SBATCH lines, repeated below, are the",
        "# same but for job name and output). The points and their values: sweep.json.",
        f"#SBATCH --job-name={sbatch_value(index['name'] + '-sweep')}",
        f"#SBATCH --output={sbatch_value(pattern)}",
        f"#SBATCH --array=0-{n - 1}" + (f"%{max_running}" if max_running else ""),
        *kept,
        "",
        "POINTS=(",
        *(f"    {shq(str(d))}" for d in point_dirs(sweep_dir, index)),
        ")",
        'exec bash "${POINTS[SLURM_ARRAY_TASK_ID]}/job.sbatch"',
    ]
    return "\n".join(lines) + "\n"


def own_dependency(script_text: str, where: str) -> str | None:
    """The point's own --dependency, checked before anything is submitted: --max-running adds to it."""
    own = directives(script_text, where)[0].get("--dependency")
    if own and "?" in own:
        raise UserError("slurm.dependency", f"{where}: {own!r} is an 'any of' (?) dependency; --max-running "
                                            "needs 'all of' (,) to add its own")
    return own


def dependency_for(own: str | None, waits_for: str | None) -> list[str]:
    """``--dependency=afterany:ID`` (with the point's own dependency, when it has one)."""
    if waits_for is None:
        return []
    return [f"--dependency={own + ',' if own else ''}afterany:{waits_for}"]


@dataclass(frozen=True)
class Submission:
    """How the points go to sbatch, decided (and every check passed) before anything is submitted."""

    mode: str  # "array" or "jobs"
    why_not_array: str | None
    own_dependencies: list[str | None]  # mode "jobs": each point's own --dependency


def check_submission(sweep_dir: Path, index: dict, scripts: dict[str, str], groups: dict[str, list[str] | None],
                     max_running: int | None) -> Submission:
    """Every check a submission makes, for every point, submitting nothing: the cluster can hold each
    point's het groups, and the points can be one array or chained jobs."""
    checked = set()
    for name, text in scripts.items():
        found = read_groups(text, str(sweep_dir / name / RunDir.SCRIPT))
        key = json.dumps([g.options for g in found], sort_keys=True)
        if key not in checked:
            fit.check(found, groups.get(name))
            checked.add(key)
    why_not = array_refusal(scripts)
    if why_not is None:
        return Submission("array", None, [])
    owns = [own_dependency(text, f"{name}/{RunDir.SCRIPT}") if max_running and i >= max_running else None
            for i, (name, text) in enumerate(scripts.items())]
    return Submission("jobs", why_not, owns)


def submit_sweep(sweep_dir: str | Path, max_running: int | None = None) -> dict:
    """Submit every point of a rendered (maybe hand-edited) sweep dir; returns the submission record.
    Everything is checked for every point before the first sbatch; when an sbatch fails part-way,
    the points already submitted are cancelled and nothing is recorded."""
    sweep_dir = Path(sweep_dir).resolve()
    index = read_index(sweep_dir)
    max_running = max_running or index.get("max_running")
    dirs = point_dirs(sweep_dir, index)
    scripts = {}
    for d in dirs:
        if not (d / RunDir.SCRIPT).is_file():
            raise UserError(str(d), "has no job.sbatch; render the sweep again")
        scripts[d.name] = read_text(d / RunDir.SCRIPT)
        check_in_place(d, scripts[d.name], d)  # a sweep dir moved elsewhere: its points write into the old place
    for d in dirs:
        check_not_running(d)
    how = check_submission(sweep_dir, index, scripts, {d.name: group_names(d) for d in dirs}, max_running)
    array_text = array_script(sweep_dir, index, scripts[dirs[0].name], max_running) if how.mode == "array" else ""
    edited = {d.name: is_edited(d) for d in dirs}
    changes = Changes()  # a failed sbatch puts every point's lock and logs back as they were
    record = {"submitted_at": datetime.now(UTC).isoformat(timespec="seconds"), "max_running": max_running}
    ids: list[str] = []
    script = RunDir(sweep_dir).sweep_script
    try:
        for d in dirs:
            changes.folders(RunDir(d).logs)
            RunDir(d).logs.mkdir(mode=0o700, exist_ok=True)  # sbatch opens logs/batch-*.out before the script runs
            lockfile.refresh(d, edited[d.name], changes=changes)
            set_aside(d, changes)
        changes.file(script)
        if how.mode == "array":
            write_text(script, array_text, executable=True)  # 0o700
            array_id = sbatch([str(script)])
            record.update(mode="array", array_job=array_id)
            ids = [f"{array_id}_{i}" for i in range(len(dirs))]
        else:
            record.update(mode="jobs", why_not_array=how.why_not_array)
            for i, d in enumerate(dirs):
                waits_for = ids[i - max_running] if max_running and i >= max_running else None
                ids.append(sbatch([*dependency_for(how.own_dependencies[i], waits_for), str(d / RunDir.SCRIPT)]))
    except BaseException as e:
        changes.rollback()
        if ids:
            tools.call(["scancel", "--", *ids], check=False)
            if isinstance(e, UserError):
                raise UserError(e.field, f"{e.message} (the {len(ids)} point(s) submitted before it were cancelled: "
                                         f"{' '.join(ids)})") from None
        raise
    changes.commit()
    for d, job_id in zip(dirs, ids):
        jobs.record(d, job_id, jobs.sha256(d / RunDir.SCRIPT), edited[d.name])
    record["job_ids"] = ids
    index["submissions"] = index.get("submissions", []) + [record]
    write_index(sweep_dir, index)
    return record


def cmd_sweep(args) -> int:
    max_running = max_running_arg(args.max_running)
    if is_sweep_dir(args.recipe):
        if args.grid or args.overrides:
            raise UserError("--grid", "applies to a recipe; this is a rendered sweep dir (edit its points, or sweep "
                                      "the recipe again)")
        sweep_dir = Path(args.recipe).resolve()
    else:
        sweep = render_points(args.recipe, args.grid, args.overrides, max_running, args.sweep_dir)
        warn(sweep.warnings)
        sweep_dir, fresh = sweep.sweep_dir, missing_folders(sweep.sweep_dir)
        if not args.render_only:  # refused here: nothing written, nothing submitted
            check_submission(sweep_dir, sweep.index, {n: f[RunDir.SCRIPT] for n, f in sweep.points.items()},
                             dict(sweep.groups), max_running or sweep.index["max_running"])
        changes = Changes()  # a refused submission puts an earlier render back as it was
        if not args.render_only:
            changes.tree(sweep_dir, {RunDir.SWEEP_INDEX, *sweep.points,
                                     *(p.name for p in (sweep_dir.iterdir() if sweep_dir.is_dir() else []))})
        write_sweep_dir(sweep_dir, sweep.points, sweep.index)
        print(f"{sweep_dir}: {len(sweep.points)} point(s), one run dir each (index: {RunDir(sweep_dir).sweep_index})")
        if args.render_only:
            print(f"  slurmrl sweep {sweep_dir}    submits it")
            return 0
        try:
            record = submit_sweep(sweep_dir, max_running)
        except UserError:
            changes.rollback()
            if fresh:  # this call wrote it: a refused submission leaves nothing behind
                shutil.rmtree(sweep_dir, ignore_errors=True)
                remove_empty(fresh)  # nor the output folders it made for it
            raise
        changes.commit()
        announce(sweep_dir, record)
        return 0
    announce(sweep_dir, submit_sweep(sweep_dir, max_running))
    return 0


def announce(sweep_dir: Path, record: dict) -> None:
    n = len(record["job_ids"])
    cap = f", at most {record['max_running']} running" if record.get("max_running") else ""
    if record["mode"] == "array":
        print(f"submitted sweep {sweep_dir}: {n} point(s) as job array {record['array_job']}{cap}")
    else:
        print(f"submitted sweep {sweep_dir}: {n} point(s) as {n} jobs {record['job_ids'][0]}..{record['job_ids'][-1]}"
              f"{cap} (not a job array: {record['why_not_array']})")
    print(f"  slurmrl status {sweep_dir}")
    print(f"  slurmrl plot {sweep_dir}")
    print(f"  slurmrl cancel {sweep_dir}")
