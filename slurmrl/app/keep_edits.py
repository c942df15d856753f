"""No edit lost: rendering over a run dir whose files were edited by hand since they were rendered
refuses, naming them, unless ``--force``. Files nobody edited are simply rendered again.

"As rendered" is what RUN_DIR/lock.toml's [lock.files] recorded (sha256 of each file the render
wrote); without a usable record (no lock, or one written for an edited submission), a fresh render
of RUN_DIR/recipe.toml, as `slurmrl diff` does. Only what the new render would replace counts:
the files it writes and the folders it owns (components/); logs and job history are carried over.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from slurmrl.errors import UserError
from slurmrl.rundir import lockfile as lock
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import read_bytes, read_json, read_text

KEPT = (RunDir.RECIPE, RunDir.LOCK)  # the source and its provenance: rewritten by every render


def _files_at_risk(run_dir: Path, files: dict[str, str]) -> list[str]:
    """Files under run_dir that a render of ``files`` replaces (relative paths, sorted)."""
    produced = {rel.split("/")[0] for rel in files}
    found = []
    for top in sorted(produced):
        path = run_dir / top
        if path.is_file() or path.is_symlink():
            found.append(top)
        elif path.is_dir():
            found += sorted(p.relative_to(run_dir).as_posix() for p in path.rglob("*") if not p.is_dir())
    return [rel for rel in found if rel not in KEPT]


class Rendering(Protocol):
    """What ``build`` returns (``slurmrl.app.build.Rendered``, which imports this module)."""

    @property
    def files(self) -> dict[str, str]: ...


def as_rendered(run_dir: Path, build: Callable[..., Rendering]) -> dict[str, str] | None:
    """What RUN_DIR/recipe.toml renders for this run dir (relative path -> text); None if it cannot."""
    try:
        script = read_text(run_dir / RunDir.SCRIPT)
        plan = read_json(run_dir / RunDir.PLAN)
        preflight = bool(plan.get("preflight")) if isinstance(plan, dict) else False
        out = build(run_dir / RunDir.RECIPE, run_dir=lock.script_run_dir(script) or run_dir, preflight=preflight,
                    source_name=lock.header_source(script))
    except (OSError, ValueError, UserError):
        return None
    return out.files


def edited_files(run_dir: Path, files: dict[str, str], fresh: Callable[[], dict[str, str] | None]) -> list[str]:
    """The files of run_dir a render of ``files`` would replace that differ from how they were rendered."""
    if not run_dir.is_dir():
        return []
    try:
        table = lock.meta(run_dir)
    except UserError:  # an unreadable lock.toml records nothing: compare with a fresh render
        table = {}
    recorded = table.get("files") if table.get("edited") is not True else None
    recorded = recorded if isinstance(recorded, dict) else None
    rendered: dict[str, str] | None = None
    edited = []
    for rel in _files_at_risk(run_dir, files):
        try:
            data = read_bytes(run_dir / rel)
        except UserError:  # not a regular file, or unreadable: not what was rendered
            edited.append(rel)
            continue
        if data == files.get(rel, "").encode("utf-8") and rel in files:
            continue  # the new render writes it as it is
        if recorded is not None:
            if recorded.get(rel) == hashlib.sha256(data).hexdigest():
                continue
        else:
            rendered = fresh() if rendered is None else rendered
            if rendered is not None and rel in rendered and rendered[rel].encode("utf-8") == data:
                continue
        edited.append(rel)
    return edited


def refuse_lost_edits(run_dir: Path, files: dict[str, str], build: Callable[..., Rendering]) -> None:
    """UserError naming the hand-edited files a render of ``files`` over run_dir would drop."""
    edited = edited_files(run_dir, files, lambda: as_rendered(run_dir, build))
    if edited:
        names = ", ".join(edited[:5]) + (f" and {len(edited) - 5} more" if len(edited) > 5 else "")
        raise UserError(str(run_dir), f"{names} {'was' if len(edited) == 1 else 'were'} edited since rendered "
                                      f"and a new render would drop the edits; keep them elsewhere first, or use "
                                      f"--force to render over them (`slurmrl diff {run_dir}` shows them)")
