"""`slurmrl cancel`: scancel the job, wait (bounded) until it has ended, print the final state."""

from __future__ import annotations

import sys

from slurmrl.app import sweep_report
from slurmrl.app.cluster import on_cluster
from slurmrl.app.sweep_dir import is_sweep_dir
from slurmrl.rundir import jobs
from slurmrl.slurm import tools
from slurmrl.slurm.watch import Watch


def cancel(target: str | None, timeout_s: float) -> int:
    run_dir = jobs.run_dir_arg(target)
    job_id = jobs.last_job(run_dir)
    watch = Watch(job_id)
    before = watch.snapshot()
    if before.done and before.parts:
        print(f"job {job_id} had already ended: {before.state}")
        return 0
    tools.out(["scancel", "--", job_id])
    print(f"job {job_id}: cancel sent; waiting up to {timeout_s:.0f}s for it to end", flush=True)
    for snap in watch.follow(timeout_s):
        pass
    if not snap.done:
        print(f"slurmrl: job {job_id} is still {snap.state} after {timeout_s:.0f}s; "
              f"check `slurmrl status {run_dir}`", file=sys.stderr)
        return 1
    print(f"job {job_id}: {snap.state}")
    return 0


def cmd_cancel(args) -> int:
    with on_cluster(args):
        if is_sweep_dir(args.run_dir):
            return sweep_report.cancel_sweep(args.run_dir, args.timeout)
        return cancel(args.run_dir, args.timeout)
