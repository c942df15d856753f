"""Write a run dir atomically: everything or nothing, never world-readable."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from slurmrl.errors import UserError

SUBMITTED = "jobs.json"  # written by `slurmrl submit`; its presence protects the run dir
KEEP = ("logs",)  # never replaced by a re-render


def submitted_job(run_dir: Path) -> str | None:
    try:
        jobs = json.loads((run_dir / SUBMITTED).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return str(jobs[-1]["job_id"]) if jobs else None


def write_run_dir(run_dir: Path, files: dict[str, str], force: bool = False) -> None:
    """Write ``files`` (relative path -> text) into ``run_dir``.

    Files are first written to a private sibling folder, then moved into place, so an error
    half-way leaves the old run dir as it was. A submitted run dir is only re-rendered with
    ``force``; its logs and job history stay.
    """
    job = submitted_job(run_dir)
    if job and not force:
        raise UserError(
            str(run_dir), f"was submitted as job {job}; use --force to render over it (logs and job history are kept)"
        )
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(str(run_dir), "exists and is not a folder")
    try:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError("output_dir", f"cannot create {run_dir.parent}: {e.strerror}") from None
    tmp = run_dir.parent / f".{run_dir.name}.rendering-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    old_umask = os.umask(0o077)
    try:
        tmp.mkdir(mode=0o700)
        (tmp / "logs").mkdir(mode=0o700)  # sbatch opens logs/batch-%j.out before the script runs
        for rel, text in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            path.write_text(text, encoding="utf-8")
            path.chmod(0o700 if rel.endswith(".sbatch") else 0o600)
        if not run_dir.exists():
            tmp.rename(run_dir)
            return
        for entry in tmp.iterdir():
            target = run_dir / entry.name
            if entry.name in KEEP and target.exists():
                continue
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            entry.replace(target)
        tmp.rmdir()
        run_dir.chmod(0o700)
    finally:
        os.umask(old_umask)
        shutil.rmtree(tmp, ignore_errors=True)
