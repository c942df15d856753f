"""Was it the OOM killer? What the kernel says about a process that SIGKILL ended, where it can be read:

- the memory cgroup the task runs in counts the processes the OOM killer ended in it: ``oom_kill`` in
  ``memory.events`` (cgroup v2) or ``memory.oom_control`` (v1). The guard reads the count when its
  command starts and when it ends: a higher count is an OOM kill in the task's cgroup (Slurm's
  ``--mem`` limit, or the node's memory running out);
- the kernel log (``/dev/kmsg``, where it may be read) names the pid it killed: "Killed process 4242".

Both may be unreadable (a container, ``dmesg_restrict``): then nothing is claimed. Standard library
only (it runs in the step's guard)."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterable
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
KMSG = "/dev/kmsg"
KILLED = re.compile(rb"(?:Killed process |oom-kill:.*[ ,]pid=)(\d+)")
MAX_RECORDS = 100_000  # of the kernel log read


def cgroup_files(proc_cgroup: str, root: Path = CGROUP_ROOT) -> list[tuple[Path, str]]:
    """(file, key line prefix) that count OOM kills for the cgroups in ``/proc/self/cgroup``'s text,
    nearest first (a container may show a path that is not there: its parents are tried)."""
    found = []
    for line in proc_cgroup.splitlines():
        num, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if num == "0" and controllers == "":  # cgroup v2
            base, name = root, "memory.events"
            if (root / "unified").is_dir():
                base = root / "unified"
        elif "memory" in controllers.split(","):
            base, name = root / "memory", "memory.oom_control"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for n in range(len(parts), -1, -1):
            f = base.joinpath(*parts[:n], name)
            if f.is_file():
                found.append((f, "oom_kill "))
                break
    return found


def oom_kills(root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    """How many processes the OOM killer has ended in this process's memory cgroup; None: unreadable."""
    try:
        text = proc_cgroup.read_text()
    except OSError:
        return None
    for f, key in cgroup_files(text, root):
        try:
            for line in f.read_text().splitlines():
                if line.startswith(key) and line[len(key):].strip().isdigit():
                    return int(line[len(key):])
        except OSError:
            continue
    return None


def kernel_killed(pids: Iterable[int], kmsg: str = KMSG) -> bool:
    """True when the kernel log says the OOM killer ended one of ``pids`` (False when it cannot be read)."""
    wanted = {int(p) for p in pids if p}
    if not wanted:
        return False
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        for _ in range(MAX_RECORDS):
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                return False
            except OSError as e:
                if e.errno == errno.EPIPE:  # records overwritten while reading: go on
                    continue
                return False
            if not record:
                return False
            m = KILLED.search(record)
            if m and int(m[1]) in wanted:
                return True
        return False
    finally:
        os.close(fd)


def signal_cause(signame: str, oom: bool) -> str:
    """How a signal's end reads: "killed by the OOM killer (SIGKILL)", "killed by SIGSEGV"."""
    return "killed by the OOM killer (SIGKILL)" if oom else f"killed by {signame}"
