"""A run dir before and after a refused submit: its files and its previous job."""

from __future__ import annotations

import json
from pathlib import Path

from slurmrl.rundir.paths import RunDir

ROOT = Path(__file__).resolve().parents[2]


RECIPE = ROOT / "slurmrl" / "recipes" / "sft-debug.toml"


def tree(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under ``root``: (mode, bytes for a file)."""
    out = {}
    for p in sorted(root.rglob("*")):
        st_ = p.lstat()
        out[p.relative_to(root).as_posix()] = (st_.st_mode, p.read_bytes() if p.is_file() else None)
    return out


def previous_job(run_dir: Path, attempts: int, runtime: bool, outputs: list[str], kept_before: bool) -> None:
    """What a run dir looks like after a job ran: jobs.json, logs per attempt, a lock with runtime entries."""
    (run_dir / "jobs.json").write_text(json.dumps([{"job_id": "41"}]))
    for a in range(attempts):
        d = RunDir(run_dir).log_dir(a)
        d.mkdir(parents=True, exist_ok=True)
        (d / "trainer.0.log").write_text(f"attempt {a}\n")
    for name in outputs:
        (run_dir / name).mkdir(exist_ok=True)
        (run_dir / name / "x").write_text(name)
    if runtime:
        lock = RunDir(run_dir).lock
        lock.write_text(lock.read_text() + '\n[[lock.runtime]]\npython = "3.11"\n')
    if kept_before:  # a set-aside folder of job 41 from an earlier try
        keep = RunDir(run_dir).set_aside_dir("41")
        (keep / "attempt-0").mkdir(parents=True)
        (keep / "attempt-0" / "old.log").write_text("older\n")
