"""`slurmrl diff RUN_DIR`: what was changed by hand in job.sbatch, against a fresh render."""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.render import build
from slurmrl.slurm import jobs

_HEADER = re.compile(r"^# slurmrl job .* rendered from (?P<file>.+)\.$", re.M)


def fresh_script(run_dir: Path) -> str:
    """job.sbatch as RUN_DIR/recipe.toml renders it now, for the same run dir (and the same mode:
    a preflight run dir re-renders as a preflight)."""
    recipe_path = run_dir / "recipe.toml"
    if not recipe_path.is_file():
        raise UserError(str(run_dir), "has no recipe.toml to render from")
    old = jobs.load_plan(run_dir)
    preflight = bool(old and jobs.is_preflight(old))
    # the header names the recipe file the run dir was first rendered from, not recipe.toml
    current = (run_dir / "job.sbatch").read_text()
    m = _HEADER.search("\n".join(current.splitlines()[:3]))
    source = m["file"] if m else recipe_path.name
    return build(recipe_path, run_dir=run_dir, preflight=preflight, source_name=source).script


def is_edited(run_dir: Path) -> bool:
    try:
        return fresh_script(run_dir) != (run_dir / "job.sbatch").read_text()
    except UserError as e:
        print(f"slurmrl: note: cannot re-render {run_dir} to compare ({e}); recording it as edited", file=sys.stderr)
        return True


def diff(target: str) -> int:
    run_dir = jobs.run_dir_arg(target)
    fresh = fresh_script(run_dir)
    current = (run_dir / "job.sbatch").read_text()
    if fresh == current:
        print(f"{run_dir}/job.sbatch: as rendered from recipe.toml")
        return 0
    sys.stdout.writelines(difflib.unified_diff(
        fresh.splitlines(keepends=True), current.splitlines(keepends=True),
        fromfile=f"{run_dir}/job.sbatch (rendered from recipe.toml)", tofile=f"{run_dir}/job.sbatch",
    ))
    return 1
