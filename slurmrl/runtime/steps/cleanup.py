"""End what earlier slurmrl jobs left on this node, before the job's components start.

A leftover is a process of this user whose environment says it is a slurmrl job's
(``SLURMRL_RUN_DIR``) task on this node (``SLURMD_NODENAME``) of a job that no longer runs
(``SLURM_JOB_ID`` not running, completing or suspended in squeue), or of an earlier attempt of this
very job (``SLURMRL_ATTEMPT`` below this one's: a requeued job keeps its id). Never found by name,
never another user's, never a running job's: when squeue cannot answer, nothing is ended. Each is
sent SIGTERM, then SIGKILL after ``TERM_WAIT_S``. Then the shared-memory files (/dev/shm) those
processes held open or mapped, unless a process still running holds them, and the port claims
(rendezvous files of our port blocks, PORT_CLAIMS/<node>/<base>) of jobs that no longer run.
Everything ended is logged, one line each."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from slurmrl.contract import job_env

PROC = Path("/proc")
SHM = "/dev/shm/"
TERM_WAIT_S = 10.0
ACTIVE_STATES = "RUNNING,COMPLETING,CONFIGURING,SUSPENDED,STOPPED,SIGNALING,RESIZING"


@dataclass(frozen=True)
class Leftover:
    pid: int
    job_id: str
    attempt: int
    run_dir: str
    command: str


def active_jobs() -> set[str] | None:
    """Ids of jobs that run now (het components and their leader); None when squeue cannot say."""
    try:
        done = subprocess.run(["squeue", "-h", "-t", ACTIVE_STATES, "-o", "%A %F"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return set(done.stdout.split()) if done.returncode == 0 else None


def environ(pid: int) -> dict[str, str]:
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def command(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
    except OSError:
        return "?"


def own_pids() -> list[int]:
    """This user's processes, this one and its ancestors left out."""
    skip, pid = set(), os.getpid()
    while pid > 1:
        skip.add(pid)
        try:
            pid = int((PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    uid = os.getuid()
    out = []
    for p in PROC.iterdir():
        if p.name.isdigit() and int(p.name) not in skip:
            try:
                if p.stat().st_uid == uid:
                    out.append(int(p.name))
            except OSError:
                continue
    return out


def attempt_of(env: dict[str, str]) -> int:
    value = env.get(job_env.ATTEMPT) or env.get("SLURM_RESTART_COUNT") or "0"
    return int(value) if value.isdigit() else 0


def find(node: str, job_ids: set[str], attempt: int, active: set[str]) -> list[Leftover]:
    """The leftovers on ``node``; ``job_ids``/``attempt``: this job's (its earlier attempts' tasks are leftovers)."""
    found = []
    for pid in own_pids():
        env = environ(pid)
        job, run_dir = env.get("SLURM_JOB_ID", ""), env.get(job_env.RUN_DIR, "")
        if not job or not run_dir or env.get("SLURMD_NODENAME") != node:
            continue
        mine = job in job_ids
        if (mine and attempt_of(env) < attempt) or (not mine and job not in active):
            found.append(Leftover(pid, job, attempt_of(env), run_dir, command(pid)))
    return found


def shm_files(pid: int) -> set[str]:
    """The /dev/shm files ``pid`` holds open or mapped."""
    out = set()
    try:
        for fd in (PROC / str(pid) / "fd").iterdir():
            target = os.readlink(fd)
            if target.startswith(SHM):
                out.add(target)
        for line in (PROC / str(pid) / "maps").read_text().splitlines():
            path = line.split(maxsplit=5)[5] if len(line.split(maxsplit=5)) == 6 else ""
            if path.startswith(SHM):
                out.add(path.removesuffix(" (deleted)"))
    except OSError:
        pass
    return out


def end(leftovers: list[Leftover]) -> list[str]:
    """TERM, then KILL after TERM_WAIT_S; one line per process."""
    lines = []
    for p in leftovers:
        try:
            os.kill(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        lines.append(f"ended pid {p.pid} of job {p.job_id} attempt {p.attempt} ({p.run_dir}): {p.command}")
    deadline = time.monotonic() + TERM_WAIT_S
    while time.monotonic() < deadline and any(alive(p.pid) for p in leftovers):
        time.sleep(0.2)
    for p in leftovers:
        if alive(p.pid):
            os.kill(p.pid, signal.SIGKILL)
            lines.append(f"killed pid {p.pid} (still there {TERM_WAIT_S:.0f}s after SIGTERM)")
    return lines


def alive(pid: int) -> bool:
    try:
        state = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def remove_shm(files: set[str]) -> list[str]:
    if not files:
        return []
    held = set().union(*(shm_files(pid) for pid in own_pids()))
    lines = []
    for f in sorted(files - held):
        try:
            os.unlink(f)
            lines.append(f"removed {f}")
        except OSError:
            continue
    return lines


def stale_claims(claims_dir: Path, node: str, active: set[str]) -> list[str]:
    """Port claim files on ``node`` of jobs that no longer run, removed."""
    lines = []
    folder = claims_dir / node
    for f in sorted(folder.iterdir()) if folder.is_dir() else []:
        try:
            owner = f.read_text().strip()
        except OSError:
            continue
        if owner and owner not in active and f.stat().st_uid == os.getuid():
            f.unlink(missing_ok=True)
            lines.append(f"removed port claim {f} of job {owner}")
    return lines


def clean(node: str, job_ids: set[str], attempt: int, claims_dir: Path) -> list[str]:
    """End this node's leftovers; what was ended, one line each (none: nothing was left)."""
    active = active_jobs()
    if active is None:
        return ["squeue did not answer: nothing ended (a running job's process must never be)"]
    leftovers = find(node, job_ids, attempt, active)
    files = set().union(*(shm_files(p.pid) for p in leftovers))
    return end(leftovers) + remove_shm(files) + stale_claims(claims_dir, node, active | job_ids)
