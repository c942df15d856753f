"""`slurmrl cancel`: scancel the job, wait (bounded) until it has ended, print the final state."""

from __future__ import annotations

import sys
import time

from slurmrl.slurm import jobs, tools
from slurmrl.slurm.watch import Watch

POLL_S = 1.0


def wait_ended(watch: Watch, timeout_s: float, progress=None, each=None):
    """Poll until the job has ended and sacct agrees (or ``timeout_s``); returns the last snapshot.

    ``progress(snap)`` is called when the state changes, ``each(snap)`` on every poll."""
    deadline = time.monotonic() + timeout_s
    ended_at = None
    last_state = None
    while True:
        snap = watch.snapshot()
        if each:
            each(snap)
        if progress and snap.state != last_state:
            progress(snap)
            last_state = snap.state
        if snap.done:
            ended_at = ended_at or time.monotonic()
            if watch.settled(snap) or time.monotonic() - ended_at > 10:
                return snap
        if time.monotonic() > deadline:
            return snap
        time.sleep(POLL_S)


def cancel(target: str | None, timeout_s: float) -> int:
    run_dir = jobs.run_dir_arg(target)
    job_id = jobs.last_job(run_dir)
    watch = Watch(job_id)
    before = watch.snapshot()
    if before.done and before.parts:
        print(f"job {job_id} had already ended: {before.state}")
        return 0
    tools.out(["scancel", job_id])
    print(f"job {job_id}: cancel sent; waiting up to {timeout_s:.0f}s for it to end", flush=True)
    snap = wait_ended(watch, timeout_s)
    if not snap.done:
        print(f"slurmrl: job {job_id} is still {snap.state} after {timeout_s:.0f}s; "
              f"check `slurmrl status {run_dir}`", file=sys.stderr)
        return 1
    print(f"job {job_id}: {snap.state}")
    return 0
