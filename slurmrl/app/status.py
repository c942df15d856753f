"""`slurmrl status`: where the job serves, its het components, per plan component its step and
readiness, the start-up phases of the current attempt, and the [benchmark] results when there are any.
This module is the verb (which job, once or ``--watch``, the table or ``--json``); the report is typed
(``status_report``), built by ``status_read`` and shown by ``status_text``."""

from __future__ import annotations

import re
import sys
import time
from datetime import datetime
from pathlib import Path

from slurmrl.app import sweep_report
from slurmrl.app.cluster import on_cluster
from slurmrl.app.status_read import report
from slurmrl.app.status_report import StatusReport
from slurmrl.app.status_text import text
from slurmrl.app.sweep_dir import is_sweep_dir
from slurmrl.errors import UserError
from slurmrl.plan.stored import load_plan
from slurmrl.rundir import jobs, strict_json
from slurmrl.rundir.paths import RunDir
from slurmrl.slurm import tools
from slurmrl.slurm.watch import Snapshot, Watch

REFRESH_S = 2.0
NOT_FOUND_AFTER_S = 15.0  # sacct lags a submit by ~1 s; a job unknown for this long does not exist


def resolve(target: str | None) -> tuple[Path | None, str]:
    """RUN_DIR, RUN_DIR/job.sbatch, a job id, or nothing (the current directory) -> (run dir, job id)."""
    if target is not None and re.fullmatch(r"\d+", target) and not Path(target).exists():
        return find_run_dir(target), target
    run_dir = jobs.run_dir_arg(target)
    return run_dir, jobs.last_job(run_dir)


def find_run_dir(job_id: str) -> Path | None:
    """The run dir of a job the controller still knows: its batch log lives in RUN_DIR/logs/."""
    r = tools.call(["scontrol", "show", "job", job_id], check=False)
    m = re.search(r"StdOut=(\S+)", r.stdout) if r.returncode == 0 else None
    if not m:
        return None
    run_dir = Path(m.group(1)).parent.parent
    try:
        ids = [j.job_id for j in jobs.history(run_dir)]
    except UserError:
        return None
    return run_dir if job_id in ids else None


def without_elapsed(value):
    """``value`` with every ``elapsed`` entry dropped, at any depth."""
    if isinstance(value, dict):
        return {k: without_elapsed(v) for k, v in value.items() if k != "elapsed"}
    if isinstance(value, list):
        return [without_elapsed(v) for v in value]
    return value


def json_of(rep: StatusReport) -> str:
    return strict_json.dumps(rep.to_json())


def submitted_at(run_dir: Path | None, job_id: str) -> float | None:
    """When the run dir's record of ``job_id`` was made (epoch seconds): its jobs.json entry, or the
    salloc allocations file; None when no record says."""
    if run_dir is None:
        return None
    for j in reversed(jobs.history(run_dir)):
        if j.job_id == job_id and j.submitted_at:
            try:
                return datetime.fromisoformat(j.submitted_at).timestamp()
            except ValueError:
                return None
    allocations = RunDir(run_dir).allocations
    return allocations.stat().st_mtime if job_id in jobs.allocations(run_dir) else None


def not_known(job_id: str, run_dir: Path | None) -> UserError:
    """A job squeue and sacct have never heard of (past the grace after its submission): one line, exit 2."""
    where = f" (the last job of run dir {run_dir})" if run_dir else ""
    return UserError(None, f"job {job_id}{where} is not known to squeue or sacct: no such job on this cluster")


def first_snapshot(w: Watch, run_dir: Path | None) -> Snapshot:
    """The job's snapshot; a job Slurm does not know yet is asked about again until
    ``NOT_FOUND_AFTER_S`` after its submission (sacct lags a submit). The last snapshot may still
    have no parts: the job is unknown."""
    snap = w.snapshot()
    since = submitted_at(run_dir, w.job_id)
    now = time.time()  # a record in the future (clock skew, a hand edit) waits one grace at most
    deadline = min(since + NOT_FOUND_AFTER_S, now + NOT_FOUND_AFTER_S) if since is not None else now
    while not snap.parts and time.time() < deadline:
        time.sleep(min(1.0, max(deadline - time.time(), 0.0)))
        snap = w.snapshot()
    return snap


def status(target: str | None, watch: bool = False, as_json: bool = False) -> int:
    run_dir, job_id = resolve(target)
    plan = load_plan(run_dir) if run_dir else None
    w = Watch(job_id)
    if not watch:
        snap = first_snapshot(w, run_dir)
        rep = report(snap, run_dir, plan)  # the run dir's files are read (and refused) first
        if not snap.parts:
            if run_dir is not None:  # what the run dir itself says, then the error
                print(json_of(rep) if as_json else text(rep), flush=True)
            raise not_known(job_id, run_dir)
        print(json_of(rep) if as_json else text(rep), flush=True)
        return 0
    started = time.monotonic()
    tty = sys.stdout.isatty() and not as_json
    last = None
    for snap in w.follow(poll_s=REFRESH_S):
        rep = report(snap, run_dir, plan)
        # a terminal is redrawn as the clock ticks; a log or a pipe gets a new report only when
        # something other than elapsed times changed
        shown = json_of(rep) if as_json else text(rep)
        key = shown if tty else strict_json.dumps(without_elapsed(rep.to_json()))
        if key != last:
            if tty:
                sys.stdout.write("\033[H\033[2J")
            print(shown, flush=True)
            last = key
        if not snap.parts and time.monotonic() - started > NOT_FOUND_AFTER_S:
            raise not_known(job_id, run_dir)
    return 0 if rep.finished() else 1


def cmd_status(args) -> int:
    with on_cluster(args):
        if is_sweep_dir(args.target):
            return sweep_report.sweep_status(args.target, watch=args.watch, as_json=args.json)
        return status(args.target, watch=args.watch, as_json=args.json)
