"""Write a run dir atomically: everything or nothing, never world-readable."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.rundir.atomic import make_parents, remove_empty
from slurmrl.rundir.jobs import submitted_job
from slurmrl.rundir.paths import RunDir


def _assemble(tmp: Path, files: dict[str, str]) -> None:
    """``files`` written afresh into the private folder ``tmp`` (scripts executable by the owner only)."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700)
    for rel, text in files.items():
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_text(text, encoding="utf-8")
        path.chmod(0o700 if rel.endswith(".sbatch") else 0o600)


def _carry_over(run_dir: Path, tmp: Path, produced: set[str], carried: list[tuple[Path, Path]]) -> None:
    """What the job wrote into the old run dir (every entry a render does not produce) moves to ``tmp``;
    each move is noted in ``carried`` as it happens, to be undone on an error."""
    if not run_dir.exists():
        return
    for entry in sorted(run_dir.iterdir()):
        if entry.name not in produced:
            entry.rename(tmp / entry.name)
            carried.append((tmp / entry.name, entry))


def write_run_dir(run_dir: Path, files: dict[str, str], force: bool = False) -> None:
    """Write ``files`` (relative path -> text) as ``run_dir``, all or nothing.

    The new run dir is assembled in a private sibling folder; what the job wrote into the old
    one (logs, jobs.json, ready files, ...) is carried over; then two renames swap the folders.
    On any error the old run dir is put back as it was. A submitted run dir is only re-rendered
    with ``force``.
    """
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(str(run_dir), "exists and is not a folder")
    job = submitted_job(run_dir)
    if job and not force:
        raise UserError(
            str(run_dir), f"was submitted as job {job}; use --force to render over it (logs and job history are kept)"
        )
    made = make_parents(run_dir)
    tmp = run_dir.parent / f".{run_dir.name}.rendering-{os.getpid()}"
    old = run_dir.parent / f".{run_dir.name}.old-{os.getpid()}"
    produced = {rel.split("/")[0] for rel in files}
    carried: list[tuple[Path, Path]] = []
    old_umask = os.umask(0o077)
    try:
        _assemble(tmp, files)
        _carry_over(run_dir, tmp, produced, carried)
        if not RunDir(tmp).logs.exists():
            RunDir(tmp).logs.mkdir(mode=0o700)  # sbatch opens logs/batch-%j.out before the script runs
        if run_dir.exists():
            run_dir.rename(old)
        tmp.rename(run_dir)
    except BaseException as e:
        if old.exists() and not run_dir.exists():
            old.rename(run_dir)
        for moved, origin in reversed(carried):
            if moved.exists():
                moved.rename(origin)
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty(made)
        if isinstance(e, OSError):
            raise UserError(str(run_dir), f"cannot be written: {e.strerror or e}") from None
        raise
    finally:
        os.umask(old_umask)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
