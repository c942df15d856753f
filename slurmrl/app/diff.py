"""`slurmrl diff RUN_DIR`: every hand edit to what the job reads, against a fresh render.

The fresh render is of RUN_DIR/recipe.toml, for the same run dir and mode (a preflight run dir
re-renders as a preflight). Compared: every file the render writes except recipe.toml (the
source): job.sbatch, plan.json, components/*.toml, whatever `build()` produces. A file the render
would write but the run dir lacks is an edit; so is a file in a folder the render owns
(components/) that the render would not write. `submit` records the same comparison in jobs.json.
"""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass
from pathlib import Path

from slurmrl.app.build import build
from slurmrl.app.cluster import on_cluster
from slurmrl.errors import UserError
from slurmrl.plan.stored import is_preflight, load_plan
from slurmrl.rundir import jobs
from slurmrl.rundir.lockfile import header_source
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import check_file, read_bytes, read_text
from slurmrl.slurm import tools


@dataclass(frozen=True)
class Edit:
    """One file that differs from the fresh render; None: the file is not there (or not rendered)."""

    path: str  # relative to the run dir
    rendered: str | None
    current: str | None


def _modes(run_dir: Path) -> list[bool]:
    """Preflight or not, as plan.json says; both when plan.json itself was edited past reading."""
    try:
        old = load_plan(run_dir)
    except UserError:
        return [False, True]
    return [bool(old and is_preflight(old))]


def fresh_files(run_dir: Path, preflight: bool) -> dict[str, str]:
    """What RUN_DIR/recipe.toml renders now (relative path -> text), recipe.toml itself left out."""
    recipe_path = RunDir(run_dir).recipe
    if check_file(recipe_path, missing=None) is None:
        raise UserError(str(run_dir), "has no recipe.toml to render from")
    # the header names the recipe file the run dir was first rendered from, not recipe.toml
    source = header_source(read_text(RunDir(run_dir).script, missing="")) or recipe_path.name
    out = build(recipe_path, run_dir=run_dir, preflight=preflight, source_name=source,
                place=tools.transport().place)  # a run dir of a cluster's job: rendered for its path there
    return {rel: text for rel, text in out.files.items() if rel != RunDir.RECIPE}


def _read(path: Path) -> str | None:
    """The file's text (None: not there); binary bytes are shown as such; a path that is not a regular
    file, or cannot be read, is one line naming it (slurmrl.rundir.read)."""
    data = read_bytes(path, missing=None)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"<not UTF-8 text: byte {e.start}>\n"


def _owned_folders(rendered: dict[str, str]) -> set[str]:
    """Folders whose every file comes from the render (render replaces them whole)."""
    return {rel.split("/")[0] for rel in rendered if "/" in rel} | {RunDir.COMPONENTS}


def _compare(run_dir: Path, rendered: dict[str, str]) -> list[Edit]:
    paths = set(rendered)
    for folder in _owned_folders(rendered):
        paths |= {p.relative_to(run_dir).as_posix() for p in (run_dir / folder).rglob("*") if p.is_file()}
    found = [Edit(rel, rendered.get(rel), _read(run_dir / rel)) for rel in sorted(paths)]
    return [e for e in found if e.rendered != e.current]


def edits(run_dir: Path) -> list[Edit]:
    """Every file that differs from the fresh render, is missing, or is extra; in path order."""
    return min((_compare(run_dir, fresh_files(run_dir, mode)) for mode in _modes(run_dir)), key=len)


def is_edited(run_dir: Path) -> bool:
    try:
        return bool(edits(run_dir))
    except UserError as e:
        print(f"slurmrl: note: cannot re-render {run_dir} to compare ({e}); recording it as edited", file=sys.stderr)
        return True


def unified(run_dir: Path, e: Edit) -> list[str]:
    """A unified diff from the fresh render to the run dir's file."""
    where = f"{run_dir}/{e.path}"
    old = f"{where} (rendered from recipe.toml)" if e.rendered is not None else f"{where} (not rendered)"
    new = where if e.current is not None else f"{where} (missing)"
    lines = difflib.unified_diff((e.rendered or "").splitlines(keepends=True),
                                 (e.current or "").splitlines(keepends=True), fromfile=old, tofile=new)
    out = [line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines]
    return out or [f"--- {old}\n", f"+++ {new}\n"]  # an empty file, missing or extra: the headers say it


def diff(target: str) -> int:
    run_dir = jobs.run_dir_arg(target)
    found = edits(run_dir)
    if not found:
        print(f"{run_dir}: no changes (every file the job reads is as recipe.toml renders it)")
        return 0
    for e in found:
        sys.stdout.writelines(unified(run_dir, e))
    return 1


def cmd_diff(args) -> int:
    with on_cluster(args):  # a run dir of a cluster's job re-renders for its path there
        return diff(args.run_dir)
