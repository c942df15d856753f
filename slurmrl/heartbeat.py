"""Heartbeats: a long-running program of the job says it is still making progress.

The task's supervisor (``slurmrl.runtime.steps.supervise --heartbeat SECONDS``) gives its command a
file in ``$SLURMRL_HEARTBEAT_FILE`` and ends the command when the file is older than SECONDS:
a hung trainer or orchestrator fails the job, naming itself, instead of burning the allocation.
Programs call ``beat()`` from their main loops, including while they wait (a beat from a side
thread would go on while the main thread is stuck). A leaf: standard library only.
"""

from __future__ import annotations

import os
import time

from slurmrl.contract import job_env

ENV = job_env.HEARTBEAT_FILE
_last = 0.0


def beat(min_interval: float = 1.0) -> None:
    """Touch the heartbeat file (at most once per ``min_interval`` seconds); no-op outside a job."""
    global _last
    path = os.environ.get(ENV)
    now = time.monotonic()
    if not path or now - _last < min_interval:
        return
    _last = now
    try:
        os.utime(path)
    except FileNotFoundError:
        open(path, "a").close()
    except OSError:
        pass


def age(path: str) -> float | None:
    """Seconds since the last beat, or None when there is no heartbeat file."""
    try:
        return time.time() - os.stat(path).st_mtime
    except OSError:
        return None
