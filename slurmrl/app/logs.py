"""`slurmrl logs`: the per-attempt component logs, each line prefixed by its file name; `-f` follows."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from slurmrl.app.cluster import on_cluster
from slurmrl.app.status import NOT_FOUND_AFTER_S
from slurmrl.errors import UserError
from slurmrl.plan.stored import load_plan
from slurmrl.rundir import jobs
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.plain import plain
from slurmrl.rundir.read import read_bytes
from slurmrl.slurm import tools
from slurmrl.slurm.watch import Watch

POLL_S = 0.5
STATE_EVERY_S = 2.0
CHUNK = 1 << 20


def attempt_dir(run_dir: Path, attempt: int | None) -> tuple[int, Path]:
    found = RunDir(run_dir).attempts()
    if attempt is None:
        attempt = found[-1] if found else 0
    elif attempt not in found:
        have = ", ".join(map(str, found)) or "none yet"
        raise UserError("--attempt", f"{run_dir} has no attempt {attempt} (attempts: {have})")
    return attempt, RunDir(run_dir).log_dir(attempt)


def files(run_dir: Path, log_dir: Path, component: str | None, job_id: str | None) -> list[Path]:
    """Component logs of one attempt (``<component>.<task>.log``) and the job's batch log."""
    found = sorted(log_dir.glob(f"{component}.*.log" if component else "*.log"))
    if component in (None, "batch") and job_id:
        batch = RunDir(run_dir).batch_log(job_id)
        if batch.exists():
            found.insert(0, batch)
    return found


def check_component(run_dir: Path, component: str | None) -> None:
    plan = load_plan(run_dir)
    if component is None or plan is None or component == "batch":
        return
    names = [c.name for c in plan.components]
    if component not in names:
        raise UserError("--component", f"{component!r} is not a component of this job; choose one of: "
                                       f"{', '.join(names + ['batch'])}")


class Tail:
    """Prints whole new lines of a set of files, ``NAME: line``; a path that is not a regular file
    (a folder, a FIFO, a link that loops) is one line naming it (slurmrl.rundir.read)."""

    def __init__(self) -> None:
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, bytes] = {}

    def pump(self, paths: list[Path], final: bool = False) -> None:
        for path in paths:
            while True:  # at most CHUNK bytes at a time, so a huge log is never held whole
                chunk = read_bytes(path, missing=None, limit=CHUNK, offset=self.offsets.get(path, 0), cut=True)
                if not chunk:
                    break
                self.offsets[path] = self.offsets.get(path, 0) + len(chunk)
                self._write(path, self.partial.pop(path, b"") + chunk)
            rest = self.partial.pop(path, b"")
            if rest and final:
                self._write(path, rest + b"\n")
            elif rest:
                self.partial[path] = rest
        sys.stdout.flush()

    def _write(self, path: Path, data: bytes) -> None:
        lines = data.split(b"\n")
        rest = lines.pop()
        if rest:
            self.partial[path] = rest
        for line in lines:
            sys.stdout.write(f"{path.name}: {plain(line.decode('utf-8', errors='replace'))}\n")


def logs(target: str | None, component: str | None, attempt: int | None, follow: bool) -> int:
    run_dir = jobs.run_dir_arg(target)
    check_component(run_dir, component)
    where = tools.transport()
    where.pull(run_dir)  # --cluster: the logs the job wrote there, brought back (again every STATE_EVERY_S)
    submitted = jobs.history(run_dir)
    job_id = submitted[-1].job_id if submitted else None
    pinned = attempt is not None
    _, log_dir = attempt_dir(run_dir, attempt)
    tail = Tail()
    if not follow:
        tail.pump(files(run_dir, log_dir, component, job_id), final=True)
        return 0
    if job_id is None:
        raise UserError(str(run_dir), "was never submitted; nothing to follow")
    watch = Watch(job_id)
    next_check = 0.0
    started = time.monotonic()
    while True:
        if not pinned:  # a requeue starts a new attempt folder: follow it
            _, log_dir = attempt_dir(run_dir, None)
        tail.pump(files(run_dir, log_dir, component, job_id))
        if time.monotonic() >= next_check:
            snap = watch.snapshot()
            where.pull(run_dir)
            next_check = time.monotonic() + STATE_EVERY_S
            if not snap.parts and time.monotonic() - started > NOT_FOUND_AFTER_S:
                raise UserError(None, f"job {job_id} is not known to squeue or sacct; nothing to follow")
            if snap.done:
                time.sleep(POLL_S)  # the last lines may land just after the state changes
                where.pull(run_dir)
                tail.pump(files(run_dir, log_dir, component, job_id), final=True)
                print(f"slurmrl: job {job_id} ended: {snap.state}", file=sys.stderr)
                return 0
        time.sleep(POLL_S)


def cmd_logs(args) -> int:
    with on_cluster(args):
        return logs(args.run_dir, args.component, args.attempt, args.follow)
