"""A sweep dir on disk: its index (sweep.json) and its points' run dirs.

    OUTPUT_DIR/NAME-sweep/
      sweep.json          the index: recipe, grid, one entry per point (name, run dir, values), submissions
      sweep.sbatch        when submitted as a job array: array task I runs point I's job.sbatch as it is
      NAME-p0/ NAME-p1/   run dirs, each rendered from the recipe with its point's values applied
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from slurmrl import layout
from slurmrl.errors import UserError
from slurmrl.render.rundir import write_run_dir
from slurmrl.slurm import jobs


def default_sweep_dir(output_dir: str, name: str) -> Path:
    return (Path(output_dir) / f"{name}-sweep").resolve()


def is_sweep_dir(path: str | Path | None) -> bool:
    return path is not None and (Path(path) / layout.SWEEP_INDEX).is_file()


def read_index(sweep_dir: Path) -> dict:
    path = Path(sweep_dir) / layout.SWEEP_INDEX
    try:
        index = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(str(sweep_dir), f"is not a sweep dir (no {layout.SWEEP_INDEX})") from None
    except ValueError:
        raise UserError(str(path), "is not valid JSON; fix or remove it") from None
    if not isinstance(index, dict) or not isinstance(index.get("points"), list):
        raise UserError(str(path), "is not a sweep index (no points)")
    return index


def write_index(sweep_dir: Path, index: dict) -> None:
    tmp = Path(sweep_dir) / f".{layout.SWEEP_INDEX}.{os.getpid()}"
    tmp.write_text(json.dumps(index, indent=1) + "\n")
    tmp.replace(Path(sweep_dir) / layout.SWEEP_INDEX)


def point_dirs(sweep_dir: Path, index: dict) -> list[Path]:
    return [Path(sweep_dir) / p["name"] for p in index["points"]]


def latest_job_ids(sweep_dir: Path, index: dict) -> list[str | None]:
    """Each point's newest job (jobs.json), None where a point was never submitted."""
    out = []
    for d in point_dirs(sweep_dir, index):
        history = jobs.history(d) if d.is_dir() else []
        out.append(str(history[-1]["job_id"]) if history else None)
    return out


def check_not_submitted(sweep_dir: Path) -> None:
    if not sweep_dir.exists():
        return
    if not is_sweep_dir(sweep_dir):
        raise UserError(str(sweep_dir), "exists and is not a sweep dir; choose another --sweep-dir")
    for d in point_dirs(sweep_dir, read_index(sweep_dir)):
        if (d / layout.JOBS).exists():
            raise UserError(str(sweep_dir), "was submitted; `slurmrl cancel` it and remove it, or choose another "
                                            "--sweep-dir")


def write_sweep_dir(sweep_dir: Path, rendered: dict[str, dict[str, str]], index: dict) -> None:
    """All points and the index at once: write_run_dir assembles the sweep dir in a private sibling
    folder and renames it into place. Points of an earlier, unsubmitted render that this grid no
    longer has are removed first (write_run_dir would carry them over)."""
    if sweep_dir.is_dir():
        for stale in sweep_dir.iterdir():
            if stale.is_dir() and stale.name not in rendered and (stale / layout.SCRIPT).is_file():
                shutil.rmtree(stale)
    files = {layout.SWEEP_INDEX: json.dumps(index, indent=1) + "\n"}
    for name, point in rendered.items():
        files.update({f"{name}/{rel}": text for rel, text in point.items()})
    write_run_dir(sweep_dir, files)
