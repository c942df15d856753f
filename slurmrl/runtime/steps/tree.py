"""A process's tree of descendants: adopt orphans, follow a parent's death, end them all.

Linux only (prctl); psutil walks the tree. Used by the supervisor and its guard so that no
process a task started outlives the task, whatever the cluster's proctrack plugin does.
"""

from __future__ import annotations

import ctypes
import os

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 10.0  # time leftovers get between TERM and KILL


def _prctl(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Orphans of our tree are re-parented to us instead of init, so we can find and end them."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(sig: int) -> bool:
    """Get ``sig`` when our parent dies (safe between fork and exec)."""
    return _prctl(PR_SET_PDEATHSIG, int(sig))


def kill(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant of it (children first found, so none is missed by reparenting)."""
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def end(grace: float = GRACE_S) -> list[int]:
    """TERM every descendant, wait up to ``grace`` seconds, KILL what is left (and what appeared
    meanwhile), reap. Returns the pids that were there."""
    me = psutil.Process()
    procs = me.children(recursive=True)
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    late = me.children(recursive=True)
    for p in alive + late:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive + late, timeout=5)
    reap()
    return [p.pid for p in procs]


def reap() -> None:
    """Collect exit statuses of adopted orphans."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
