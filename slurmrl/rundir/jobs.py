"""The run dir's job history (``jobs.json``) and finding the run dir a command is about."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.rundir.atomic import write_text
from slurmrl.rundir.jobids import check_job_id, is_job_id
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import check_file, kind, read_bytes, read_json, read_text

NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}"


@dataclass(frozen=True)
class JobRecord:
    """One ``slurmrl submit`` of the run dir (an entry of jobs.json)."""

    job_id: str
    submitted_at: str | None = None
    script_sha256: str | None = None
    edited: bool | None = None
    cluster: str | None = None  # submitted with --cluster NAME: later commands on the run dir go there too

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None or k in ("submitted_at", "script_sha256")}


def sha256(path: Path) -> str:
    return hashlib.sha256(read_bytes(path)).hexdigest()


def _entry(item, path: Path, i: int) -> JobRecord:
    where = f"{path} entry {i + 1}"
    if not isinstance(item, dict):
        raise UserError(where, f"should be a table with a job_id, not {kind(item)}")
    if "job_id" not in item:
        raise UserError(where, "has no job_id")
    job_id = check_job_id(item["job_id"], where)
    fields = {}
    for key in ("submitted_at", "script_sha256", "cluster"):
        value = item.get(key)
        if value is not None and not (isinstance(value, str) and value.isprintable()):
            raise UserError(where, f"{key} should be one line of text, not {kind(value)}")
        fields[key] = value
    cluster = fields["cluster"]
    if cluster is not None:
        if not re.fullmatch(NAME, cluster):
            raise UserError(where, f"cluster {cluster[:40]!r} is not a cluster name")
    edited = item.get("edited")
    if edited is not None and not isinstance(edited, bool):
        raise UserError(where, f"edited should be true or false, not {kind(edited)}")
    return JobRecord(job_id, fields["submitted_at"], fields["script_sha256"], edited, cluster)


def history(run_dir: Path) -> list[JobRecord]:
    """Every job submitted from the run dir, oldest first ([] when it was never submitted)."""
    path = RunDir(run_dir).jobs
    data = read_json(path, missing=None)
    if data is None:
        return []
    if not isinstance(data, list):
        raise UserError(str(path), f"should hold a list of submitted jobs, not {kind(data)}; fix or remove it")
    return [_entry(item, path, i) for i, item in enumerate(data)]


def record(run_dir: Path, job_id: str, script_sha256: str, edited: bool, cluster: str | None = None) -> JobRecord:
    entry = JobRecord(check_job_id(job_id, "sbatch"), datetime.now(UTC).isoformat(timespec="seconds"),
                      script_sha256, edited, cluster or None)
    jobs = history(run_dir) + [entry]
    write_text(RunDir(run_dir).jobs, json.dumps([j.to_json() for j in jobs], indent=1) + "\n", umask=None)
    return entry


def allocations(run_dir: Path) -> list[str]:
    """Job ids of `bash job.sbatch` runs inside salloc (the script appends them); other words are left out."""
    text = read_text(RunDir(run_dir).allocations, missing="")
    return [w for w in text.split() if is_job_id(w)]


def last_job(run_dir: Path) -> str:
    """The run dir's newest job: the last one submitted, else the last `bash job.sbatch` inside salloc."""
    jobs = history(run_dir)
    if jobs:
        return jobs[-1].job_id
    found = allocations(run_dir)
    if found:
        return found[-1]
    raise UserError(str(run_dir), f"has no {RunDir.JOBS}: it was never submitted; `slurmrl submit {run_dir}`")


def submitted_job(run_dir: Path) -> str | None:
    """The newest job submitted from the run dir (None: never submitted, or no history to read)."""
    try:
        jobs = history(run_dir)
    except UserError:
        return "(unreadable jobs.json)" if RunDir(run_dir).jobs.exists() else None
    return jobs[-1].job_id if jobs else None


def run_dir_arg(value: str | None) -> Path:
    """A run dir given on the command line (or the current directory when it is one)."""
    if value is None:
        here = Path.cwd()
        if RunDir(here).jobs.is_file():
            return here
        raise UserError(None, "give a run dir (or run this inside one: the current directory has no jobs.json)")
    path = Path(value)
    if path.is_file() and path.name in (RunDir.SCRIPT, RunDir.JOBS):
        path = path.parent
    if not path.is_dir():
        raise UserError(value, "no such run dir")
    if check_file(RunDir(path).script, missing=None) is None:  # one that is not a regular file: named
        raise UserError(value, "is not a run dir (no job.sbatch); `slurmrl render RECIPE` makes one")
    return path.resolve()
