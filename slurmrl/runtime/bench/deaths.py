"""Failed requests of a benchmark point that a server's death explains.

A server of the job that dies while a point runs (a SIGKILL, an engine crash: its supervisor restarts it
in place, docs/slurm.md "Restarts") takes the requests it was answering with it: a streamed reply that
has begun cannot be sent again elsewhere. The router sends the requests after it to the other servers,
so a death may cost at most the requests in flight at that moment, and with a concurrency cap C there are
never more than C. A point's failed requests are therefore *explained* when the job's events
(RUN_DIR/events.jsonl, ``slurmrl.contract.events``) record ``died`` servers during the point and the
failures are at most C per death (a point without a cap: any number): the benchmark records them in the
point's summary (``deaths``, ``failed_with_deaths``) and does not fail for them. More failures than
that, or failures without a death, fail it as before.

Each point's file also keeps when each request started and how long it took (``requests``: [start,
latency, ok], the start on the benchmark's monotonic clock, ``time.perf_counter``), so a reader can count
the requests in flight at a given moment. Standard library only."""

from __future__ import annotations

import time
from pathlib import Path

from slurmrl.contract import events, job_env
from slurmrl.rundir.paths import RunDir

WAIT_S = 15.0  # a death is recorded when the dead server's process ends: seconds after its engine died


def events_file() -> Path | None:
    """The run dir's events inside a job; None outside one."""
    return RunDir.from_env().events if job_env.in_job() else None


def deaths_since(path: Path | None, since: float, wait_s: float = WAIT_S) -> int:
    """``died`` events in ``path`` from ``since`` (wall clock) on; waits up to ``wait_s`` for a first one."""
    if path is None:
        return 0
    deadline = time.monotonic() + wait_s
    while True:
        n = sum(1 for e in events.read(path) if e.kind == "died" and e.time >= since)
        if n or time.monotonic() >= deadline:
            return n
        time.sleep(1.0)


def explain(point: dict, concurrency: int | None, started: float, path: Path | None) -> dict:
    """``point`` (a summary line) with ``deaths`` and ``failed_with_deaths`` added when it has failed
    requests: the deaths recorded since ``started`` (wall clock), and how many failures they explain."""
    failed = int(point.get("failed") or 0)
    if not failed:
        return point
    deaths = deaths_since(path, started, WAIT_S)
    explained = 0 if not deaths else failed if concurrency is None else min(failed, concurrency * deaths)
    return point | {"deaths": deaths, "failed_with_deaths": explained}


def unexplained(point: dict) -> int:
    """Failed requests of ``point`` that no server's death explains."""
    return int(point.get("failed") or 0) - int(point.get("failed_with_deaths") or 0)


def request_times(result: dict) -> list[list]:
    """[start, latency, ok] of each request of vLLM's result (``--save-detailed``): start on the
    benchmark's monotonic clock, latency 0 for a failed request."""
    starts, latencies, errors = (result.get(k) or [] for k in ("start_times", "latencies", "errors"))
    if not (len(starts) == len(latencies) == len(errors)):
        return []
    return [[round(float(s), 6), round(float(lat), 6), not e] for s, lat, e in zip(starts, latencies, errors, strict=True)]
