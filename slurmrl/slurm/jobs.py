"""The run dir's job history (``jobs.json``) and finding the run dir a command is about."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path

from slurmrl import layout

from slurmrl.errors import UserError
from slurmrl.plan import Plan
from slurmrl.render.rundir import SUBMITTED


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def history(run_dir: Path) -> list[dict]:
    path = run_dir / SUBMITTED
    try:
        jobs = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except ValueError:
        raise UserError(str(path), "is not valid JSON; fix or remove it") from None
    if not isinstance(jobs, list):
        raise UserError(str(path), "should hold a list of submitted jobs")
    return jobs


def record(run_dir: Path, job_id: str, script_sha256: str, edited: bool, cluster: str | None = None) -> dict:
    entry = {
        "job_id": job_id,
        "submitted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "script_sha256": script_sha256,
        "edited": edited,
    }
    if cluster:  # submitted with --cluster NAME: later commands on the run dir go there too
        entry["cluster"] = cluster
    jobs = history(run_dir) + [entry]
    tmp = run_dir / f".{SUBMITTED}.{os.getpid()}"
    tmp.write_text(json.dumps(jobs, indent=1) + "\n")
    tmp.replace(run_dir / SUBMITTED)
    return entry


def last_job(run_dir: Path) -> str:
    """The run dir's newest job: the last one submitted, else the last `bash job.sbatch` inside salloc."""
    jobs = history(run_dir)
    if jobs:
        return str(jobs[-1]["job_id"])
    try:
        allocations = (run_dir / layout.ALLOCATIONS).read_text().split()
    except OSError:
        allocations = []
    if allocations and allocations[-1].isdigit():
        return allocations[-1]
    raise UserError(str(run_dir), f"has no {SUBMITTED}: it was never submitted; `slurmrl submit {run_dir}`")


def run_dir_arg(value: str | None) -> Path:
    """A run dir given on the command line (or the current directory when it is one)."""
    if value is None:
        here = Path.cwd()
        if (here / SUBMITTED).is_file():
            return here
        raise UserError(None, "give a run dir (or run this inside one: the current directory has no jobs.json)")
    path = Path(value)
    if path.is_file() and path.name in ("job.sbatch", SUBMITTED):
        path = path.parent
    if not path.is_dir():
        raise UserError(value, "no such run dir")
    if not (path / "job.sbatch").is_file():
        raise UserError(value, "is not a run dir (no job.sbatch); `slurmrl render RECIPE` makes one")
    return path.resolve()


def load_plan(run_dir: Path) -> Plan | None:
    try:
        return Plan.model_validate_json((run_dir / "plan.json").read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        raise UserError(str(run_dir / "plan.json"), "cannot be read as a plan; re-render the run dir") from None


def is_preflight(plan: Plan) -> bool:
    """A preflight run dir: every component runs the probe."""
    return plan.preflight


def attempts(run_dir: Path) -> list[int]:
    return layout.attempts(run_dir)
