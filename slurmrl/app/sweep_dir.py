"""A sweep dir on disk: its index (sweep.json) and its points' run dirs.

    OUTPUT_DIR/NAME-sweep/
      sweep.json          the index: recipe, grid, one entry per point (name, run dir, values), submissions
      sweep.sbatch        when submitted as a job array: array task I runs point I's job.sbatch as it is
      NAME-p0/ NAME-p1/   run dirs, each rendered from the recipe with its point's values applied
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.recipe.fields import NAME_RE
from slurmrl.recipe.sweep import MAX_SWEEP_POINTS
from slurmrl.rundir import jobs, sweep_index
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.write import write_run_dir


def default_sweep_dir(output_dir: str, name: str) -> Path:
    return (Path(output_dir) / f"{name}-sweep").resolve()


def is_sweep_dir(path: str | Path | None) -> bool:
    return path is not None and RunDir(path).sweep_index.is_file()


def read_index(sweep_dir: Path) -> dict:
    """SWEEP_DIR/sweep.json as data. The run-dir layer's reader (slurmrl.rundir.sweep_index) checks its
    types, its points' names being unique words and its job ids; a sweep asks more of it: names are
    run names (they reach paths and #SBATCH lines) and max_running is within the [sweep] table's range."""
    typed = sweep_index.read_index(sweep_dir)
    path = RunDir(sweep_dir).sweep_index

    def bad(what: str) -> UserError:
        return UserError(str(path), f"{what}; fix or remove it (or render the sweep again)")

    if not re.match(NAME_RE, typed.name):
        raise bad(f"its name {typed.name!r} is not a run name")
    for i, point in enumerate(typed.points):
        if not re.match(NAME_RE, point.name):
            raise bad(f"point {i} has no run name")
    if typed.max_running is not None and typed.max_running > MAX_SWEEP_POINTS:
        raise bad(f"max_running {typed.max_running!r} is not a number of jobs from 1 to {MAX_SWEEP_POINTS}")
    index = typed.data  # what the reader checked, with what it read by default written in
    for entry, point in zip(index["points"], typed.points):
        entry["index"], entry["values"] = point.index, point.values
    index["submissions"] = list(typed.submissions)
    return index


def write_index(sweep_dir: Path, index: dict) -> None:
    sweep_index.write_index(sweep_dir, index)


def point_dirs(sweep_dir: Path, index: dict) -> list[Path]:
    return [Path(sweep_dir) / p["name"] for p in index["points"]]


def latest_job_ids(sweep_dir: Path, index: dict) -> list[str | None]:
    """Each point's newest job (jobs.json), None where a point was never submitted."""
    out = []
    for d in point_dirs(sweep_dir, index):
        history = jobs.history(d) if d.is_dir() else []
        last = history[-1] if history else None
        job_id = last.job_id if last is not None else None  # checked as a Slurm job id by the reader
        out.append(job_id)
    return out


def check_not_submitted(sweep_dir: Path) -> None:
    if not sweep_dir.exists():
        return
    if not is_sweep_dir(sweep_dir):
        raise UserError(str(sweep_dir), "exists and is not a sweep dir; choose another --sweep-dir")
    for d in point_dirs(sweep_dir, read_index(sweep_dir)):
        if RunDir(d).jobs.exists():
            raise UserError(str(sweep_dir), "was submitted; `slurmrl cancel` it and remove it, or choose another "
                                            "--sweep-dir")


def write_sweep_dir(sweep_dir: Path, rendered: dict[str, dict[str, str]], index: dict) -> None:
    """All points and the index at once: write_run_dir assembles the sweep dir in a private sibling
    folder and renames it into place. Points of an earlier, unsubmitted render that this grid no
    longer has are removed first (write_run_dir would carry them over)."""
    if sweep_dir.is_dir():
        for stale in sweep_dir.iterdir():
            if stale.is_dir() and stale.name not in rendered and RunDir(stale).script.is_file():
                shutil.rmtree(stale)
    files = {RunDir.SWEEP_INDEX: sweep_index.index_text(index)}
    for name, point in rendered.items():
        files.update({f"{name}/{rel}": text for rel, text in point.items()})
    write_run_dir(sweep_dir, files)
