"""`slurmrl sweep RECIPE --grid trainer.lr=1e-6,3e-6 --grid inference.tp=1,2 [--max-running N]`.

One complete, hand-editable run dir per point of the grid (every combination of the values),
under a sweep dir with an index:

    OUTPUT_DIR/NAME-sweep/
      sweep.json          the index: recipe, grid, one entry per point (name, run dir, values), submissions
      sweep.sbatch        when submitted as a job array: array task I runs point I's job.sbatch as it is
      NAME-p0/ NAME-p1/   run dirs, each rendered from the recipe with its point's values applied as
                          --set applies them (recipe.toml, lock.toml, job.sbatch, ...)

A recipe may carry the grid in a ``[sweep]`` table (``grid``, ``max_running``); ``--grid`` adds
keys or replaces them. Every point is validated and planned before anything is written; a bad
grid (unknown field, a value of the wrong type, no values) is one line naming the field.

Submitting: as one Slurm job array (``--array=0-N%M``) when every point is a plain job with the same
#SBATCH lines (but job name and output); Slurm refuses a job array of heterogeneous jobs
(22.05: "Invalid job array specification"), and an array has one set of directives, so otherwise
as one job per point, each waiting (``--dependency=afterany``) for the one ``max_running`` before it.
"""

from __future__ import annotations

import copy
import itertools
import json
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import read_text
from slurmrl.rundir.sweep_index import SweepIndex, index_text, read_index, write_index
from slurmrl.rundir.text import is_one_line

NOT_SWEPT = {"name": "each point's run dir is named after it", "output_dir": "the sweep dir holds the points",
             "sweep": "the grid cannot sweep itself", "lock": "it is provenance, not a setting"}
ARRAY_OWN = ("--job-name", "--output", "--error", "--array")  # what the array script sets itself


# ---- the grid ------------------------------------------------------------------------------
def split_values(text: str) -> list[str]:
    """``1e-6,3e-6`` -> ['1e-6', '3e-6']; commas inside [...], {...} or quotes do not split."""
    out, depth, quote, cur = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    out.append(cur.strip())
    return out


def parse_grid(items: list[str]) -> dict[str, list[str]]:
    """``--grid KEY=V1,V2`` options -> {key: [value text, ...]} (values read later as --set reads them)."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key or not all(p.strip() for p in key.split(".")):
            raise UserError("--grid", f"{item!r} is not KEY.PATH=V1,V2,...")
        if key in grid:
            raise UserError(key, "is given twice with --grid; list all its values once: KEY=V1,V2")
        texts = split_values(values)
        if not values.strip() or any(t == "" for t in texts):
            raise UserError(key, f"--grid {item!r} gives an empty value; list values: {key}=V1,V2")
        grid[key] = texts
    return grid


def toml_literal(value) -> str:
    from slurmrl.rundir import tomlw

    return tomlw._value(value)


def check_keys(grid: dict[str, list]) -> None:
    from slurmrl.recipe.load import parse_override

    for key, texts in grid.items():
        top = key.split(".")[0]
        if top in NOT_SWEPT:
            raise UserError(key, f"cannot be swept: {NOT_SWEPT[top]}")
        values = [parse_override(f"{key}={t}")[1] for t in texts]
        seen = [json.dumps(v, sort_keys=True, default=str) for v in values]
        if len(set(seen)) != len(seen):
            raise UserError(key, f"lists a value twice: {', '.join(texts)}")


def points(grid: dict[str, list[str]]) -> list[dict[str, str]]:
    """Every combination, the first key varying slowest: [{key: value text}, ...]."""
    from slurmrl.recipe.schema import MAX_SWEEP_POINTS

    count = 1
    for texts in grid.values():
        count *= len(texts)
    if count > MAX_SWEEP_POINTS:
        raise UserError("--grid", f"{count} points; a sweep renders at most {MAX_SWEEP_POINTS} run dirs")
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


# ---- rendering -------------------------------------------------------------------------------
def point_name(name: str, i: int) -> str:
    return f"{name}-p{i}"


def default_sweep_dir(output_dir: str, name: str) -> Path:
    return (Path(output_dir) / f"{name}-sweep").resolve()


def is_sweep_dir(path: str | Path | None) -> bool:
    return path is not None and (RunDir(path).sweep_index).is_file()


def point_dirs(sweep_dir: Path, index: SweepIndex) -> list[Path]:
    return index.point_dirs(sweep_dir)


def render_sweep(recipe_path: str | Path, grid_items: list[str], overrides: list[str] = (),
                 max_running: int | None = None, sweep_dir: str | Path | None = None) -> Path:
    """Validate and plan every point, then write the sweep dir at once (nothing on any error)."""
    from slurmrl.recipe.load import apply_overrides, read_toml, validate
    from slurmrl.render import build, lock_text
    from slurmrl.rundir import lockfile as lock
    from slurmrl.rundir import tomlw

    recipe_path = Path(recipe_path)
    if recipe_path.is_dir():
        raise UserError(str(recipe_path), "is a folder; give the recipe's .toml file (or a sweep dir to submit it)")
    data = read_toml(recipe_path)
    if "lock" in data:
        lock.check_table(data.pop("lock"))
    data = apply_overrides(data, list(overrides))
    base = validate(data)  # the base recipe and its [sweep] table, by the schema
    data.pop("sweep", None)
    grid = {k: [toml_literal(v) for v in vs] for k, vs in (base.sweep.grid.items() if base.sweep else [])}
    grid.update(parse_grid(grid_items))
    if not grid:
        raise UserError("--grid", "no grid: give --grid KEY=V1,V2 (or a [sweep] table with grid in the recipe)")
    check_keys(grid)
    max_running = max_running or (base.sweep.max_running if base.sweep else None)
    combos = points(grid)
    out_dir = Path(sweep_dir).resolve() if sweep_dir else default_sweep_dir(base.output_dir, base.name)
    if base.templates_dir:  # relative to the recipe file: the points are rendered from elsewhere
        data["templates_dir"] = str((recipe_path.parent / base.templates_dir).resolve())
    check_not_submitted(out_dir)

    rendered: dict[str, dict[str, str]] = {}
    entries = []
    with tempfile.TemporaryDirectory(prefix="slurmrl-sweep-") as tmp:
        for i, combo in enumerate(combos):
            name = point_name(base.name, i)
            pdata = copy.deepcopy(data)
            try:
                apply_overrides(pdata, [f"{k}={v}" for k, v in combo.items()])
                pdata["name"], pdata["output_dir"] = name, str(out_dir)
                src = Path(tmp) / f"p{i}" / recipe_path.name
                src.parent.mkdir()
                src.write_text(tomlw.dumps(pdata))
                out = build(src, run_dir=out_dir / name, source_name=recipe_path.name)
            except UserError as e:
                where = ", ".join(f"{k}={v}" for k, v in combo.items())
                raise UserError(e.field, f"{e.message} (sweep point {i}: {where})") from None
            except TypeError as e:  # a TOML date or time the writer cannot carry
                raise UserError(next(iter(combo)), f"cannot be swept here: {e}") from None
            files = dict(out.files)
            files[RunDir.LOCK] = lock_text(out, recipe_path, sweep=str(out_dir), sweep_point=i)
            files[RunDir.LINKS] = json.dumps({"sweep": str(out_dir)}, indent=1) + "\n"
            rendered[name] = files
            values = {k: json.loads(json.dumps(_value(k, v), default=str)) for k, v in combo.items()}
            entries.append({"index": i, "name": name, "run_dir": str(out_dir / name), "values": values,
                            "groups": len(out.plan.groups)})

    index = {
        "format": 1,
        "name": base.name,
        "recipe": str(recipe_path.resolve()),
        "overrides": list(overrides),
        "grid": {k: [_value(k, t) for t in ts] for k, ts in grid.items()},
        "max_running": max_running,
        "rendered_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "points": entries,
        "submissions": [],
    }
    write_sweep_dir(out_dir, rendered, index)
    return out_dir


def _value(key: str, text: str):
    from slurmrl.recipe.load import parse_override

    return parse_override(f"{key}={text}")[1]


def check_not_submitted(sweep_dir: Path) -> None:
    if not sweep_dir.exists():
        return
    if not is_sweep_dir(sweep_dir):
        raise UserError(str(sweep_dir), "exists and is not a sweep dir; choose another --sweep-dir")
    for d in point_dirs(sweep_dir, read_index(sweep_dir)):
        if (RunDir(d).jobs).exists():
            raise UserError(str(sweep_dir), "was submitted; `slurmrl cancel` it and remove it, or choose another "
                                            "--sweep-dir")


def write_sweep_dir(sweep_dir: Path, rendered: dict[str, dict[str, str]], index: dict) -> None:
    """All points and the index at once: write_run_dir assembles the sweep dir in a private sibling
    folder and renames it into place. Points of an earlier, unsubmitted render that this grid no
    longer has are removed first (write_run_dir would carry them over)."""
    from slurmrl.rundir.write import write_run_dir

    if sweep_dir.is_dir():
        for stale in sweep_dir.iterdir():
            if stale.is_dir() and stale.name not in rendered and (RunDir(stale).script).is_file():
                shutil.rmtree(stale)
    files = {RunDir.SWEEP_INDEX: index_text(index)}
    for name, point in rendered.items():
        files.update({f"{name}/{rel}": text for rel, text in point.items()})
    write_run_dir(sweep_dir, files)


# ---- submitting ------------------------------------------------------------------------------
def directives(script_text: str, where: str) -> list[dict[str, str]]:
    from slurmrl.slurm.script import read_groups

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


def array_script(sweep_dir: Path, index: SweepIndex, first_script: str, max_running: int | None) -> str:
    from slurmrl.render.quoting import shq
    from slurmrl.slurm.script import SHORT

    n = len(index.points)
    own = set(ARRAY_OWN) | {k for k, v in SHORT.items() if v in ARRAY_OWN}
    kept = [line for line in sbatch_lines(first_script)
            if line.split()[1:2] and line.split()[1].split("=")[0] not in own]
    if not is_one_line(str(sweep_dir)) or "\t" in str(sweep_dir):
        raise UserError(str(sweep_dir)[:60], "a sweep dir's path goes into sweep.sbatch's #SBATCH lines; it cannot "
                                             "hold a line break or a tab")
    pattern = RunDir(sweep_dir / f"{index.name}-p%a").array_batch_log_pattern()
    lines = [
        "#!/bin/bash",
        f"# slurmrl sweep {index.name}: {n} point(s), one job array; array task I runs point I's job.sbatch",
        "# as it is (every point asks for the same resources; their #SBATCH lines, repeated below, are the",
        "# same but for job name and output). The points and their values: sweep.json.",
        f"#SBATCH --job-name={index.name}-sweep",
        f"#SBATCH --output={pattern}",
        f"#SBATCH --array=0-{n - 1}" + (f"%{max_running}" if max_running else ""),
        *kept,
        "",
        "POINTS=(",
        *(f"    {shq(str(d))}" for d in point_dirs(sweep_dir, index)),
        ")",
        f'exec bash "${{POINTS[SLURM_ARRAY_TASK_ID]}}/{RunDir.SCRIPT}"',
    ]
    return "\n".join(lines) + "\n"


def sbatch(argv: list[str]) -> str:
    from slurmrl.slurm import tools

    out = tools.out(["sbatch", "--parsable", *argv]).strip()
    job_id = out.splitlines()[-1].split(";")[0] if out else ""
    if not job_id.isdigit():
        raise UserError(None, f"sbatch printed {out!r}, not a job id")
    return job_id


def dependency_for(script_text: str, waits_for: str | None) -> list[str]:
    """``--dependency=afterany:ID`` (with the point's own dependency, when it has one)."""
    if waits_for is None:
        return []
    own = directives(script_text, RunDir.SCRIPT)[0].get("--dependency")
    if own and "?" in own:
        raise UserError("slurm.dependency", f"{own!r} is an 'any of' (?) dependency; --max-running needs "
                                            "'all of' (,) to add its own")
    return [f"--dependency={own + ',' if own else ''}afterany:{waits_for}"]


def submit_sweep(sweep_dir: str | Path, max_running: int | None = None) -> dict:
    """Submit every point of a rendered (maybe hand-edited) sweep dir; returns the submission record."""
    from slurmrl.rundir import jobs
    from slurmrl.rundir import lockfile as lock
    from slurmrl.slurm import fit
    from slurmrl.slurm.diff import is_edited
    from slurmrl.slurm.script import read_groups
    from slurmrl.slurm.submit import check_not_running, group_names, set_aside

    sweep_dir = Path(sweep_dir).resolve()
    index = read_index(sweep_dir)
    max_running = max_running or index.max_running
    dirs = point_dirs(sweep_dir, index)
    scripts = {}
    for d in dirs:
        if not (RunDir(d).script).is_file():
            raise UserError(str(d), "has no job.sbatch; render the sweep again")
        scripts[d.name] = read_text(RunDir(d).script)
    checked = set()
    for d in dirs:
        (RunDir(d).logs).mkdir(mode=0o700, exist_ok=True)  # sbatch opens logs/batch-*.out before the script runs
        groups = read_groups(scripts[d.name], str(RunDir(d).script))
        key = json.dumps([g.options for g in groups], sort_keys=True)
        if key not in checked:
            fit.check(groups, group_names(d))
            checked.add(key)
        check_not_running(d)
    edited = {d.name: is_edited(d) for d in dirs}
    for d in dirs:
        lock.refresh(d, edited[d.name])
        set_aside(d)
    why_not = array_refusal(scripts)
    record = {"submitted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "max_running": max_running}
    ids: list[str] = []
    try:
        if why_not is None:
            text = array_script(sweep_dir, index, scripts[dirs[0].name], max_running)
            script = RunDir(sweep_dir).sweep_script
            script.write_text(text)
            script.chmod(0o700)
            array_id = sbatch([str(script)])
            record.update(mode="array", array_job=array_id)
            for i, d in enumerate(dirs):
                ids.append(f"{array_id}_{i}")
                jobs.record(d, ids[-1], jobs.sha256(RunDir(d).script), edited[d.name])
        else:
            record.update(mode="jobs", why_not_array=why_not)
            for i, d in enumerate(dirs):
                waits_for = ids[i - max_running] if max_running and i >= max_running else None
                job_id = sbatch([*dependency_for(scripts[d.name], waits_for), str(RunDir(d).script)])
                ids.append(job_id)
                jobs.record(d, job_id, jobs.sha256(RunDir(d).script), edited[d.name])
    finally:
        if ids:
            record["job_ids"] = ids
            write_index(sweep_dir, {**index.data, "submissions": [*index.submissions, record]})
    return record


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


def latest_job_ids(sweep_dir: Path, index: SweepIndex) -> list[str | None]:
    """Each point's newest job (jobs.json), None where a point was never submitted."""
    from slurmrl.rundir import jobs

    out = []
    for d in point_dirs(sweep_dir, index):
        history = jobs.history(d) if d.is_dir() else []
        out.append(history[-1].job_id if history else None)
    return out


def cancel_sweep(sweep_dir: str | Path, timeout_s: float) -> int:
    """scancel every point's job, then wait (bounded) until each has ended."""
    import time

    from slurmrl.slurm import tools
    from slurmrl.slurm.watch import snapshots

    sweep_dir = Path(sweep_dir).resolve()
    index = read_index(sweep_dir)
    ids = [j for j in latest_job_ids(sweep_dir, index) if j]
    if not ids:
        raise UserError(str(sweep_dir), "was never submitted; `slurmrl sweep` it")
    active = [j for j, s in snapshots(ids).items() if not s.done]
    if not active:
        print(f"sweep {sweep_dir}: every point had already ended")
        return 0
    tools.out(["scancel", "--", *active])
    print(f"sweep {sweep_dir}: cancel sent to {len(active)} job(s); waiting up to {timeout_s:.0f}s", flush=True)
    deadline = time.monotonic() + timeout_s
    while True:
        snaps = snapshots(active)
        left = [j for j, s in snaps.items() if not s.done]
        if not left:
            print("  " + ", ".join(f"{j} {s.state}" for j, s in snaps.items()))
            return 0
        if time.monotonic() > deadline:
            print(f"slurmrl: job(s) {' '.join(left)} still not ended after {timeout_s:.0f}s; check "
                  f"`slurmrl status {sweep_dir}`", file=sys.stderr)
            return 1
        time.sleep(1.0)
