"""One server that spans several nodes restarts as a whole (``--worker-tasks N``: a vLLM deployment whose
data-parallel ranks run as N consecutive tasks of one srun step, one per node; the first serves the API).

Each task has its own supervisor, so the tasks of the worker meet in a folder of the run dir
(``RunDir.worker_restart_dir``), one round per restart K:

- the task whose command ended first unasked *claims* round K: it creates ``down-K`` (exclusively; the
  file says ``restart`` or ``dead``, and why) and records the death (``died``, and ``dead`` when no restart
  is left). A task whose command ended in the same moment finds the claim and follows it;
- every other task watches for ``down-K`` while its command runs (every second) and, seeing it, stops
  its command (TERM to its guard, which ends the command's tree): the worker cannot serve without it;
- each task, its command's tree ended, writes ``ended-K.<task>`` and waits until every task of the
  worker has (``MEET_S``, a deadline: a task that never comes ends the round as dead), then the backoff,
  then relaunches its command: the same srun task, so the same node, GPUs and ports; each task becomes
  ready as at the first start, and the claimer records ``restarted``.

``dead``: every task ends with its command's code, and the job script does what it does with a dead
server. A stop the supervisor is asked for (the job's teardown) ends the wait at once. Standard library
only."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from slurmrl.contract import job_env
from slurmrl.rundir.paths import RunDir

MEET_S = 120.0  # how long the tasks of a worker wait for each other's commands to have ended
POLL_S = 1.0


@dataclass(frozen=True)
class Worker:
    """Task ``task`` of the worker of tasks ``first`` .. ``first + size - 1``, meeting in ``folder``."""

    task: int
    first: int
    size: int
    folder: Path

    @classmethod
    def here(cls, component: str, size: int) -> Worker | None:
        """This task's worker inside a job script (SLURM_PROCID, the run dir); None outside one or for a
        worker of one task."""
        if size <= 1 or not job_env.in_job():
            return None
        task = int(os.environ.get("SLURM_PROCID", "0"))
        first = task - task % size
        folder = RunDir.from_env().worker_restart_dir(RunDir.attempt_from_env(), component, first)
        return cls(task, first, size, folder)

    @property
    def tasks(self) -> range:
        return range(self.first, self.first + self.size)

    def down(self, k: int) -> Path:
        return self.folder / f"down-{k}"

    def claim(self, k: int, dead: bool, why: str) -> bool:
        """Take round ``k`` for this task (True), saying whether the worker restarts or is dead; False when
        another task of the worker took it first."""
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.down(k), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, f"{'dead' if dead else 'restart'} task {self.task}: {why}\n".encode())
        finally:
            os.close(fd)
        return True

    def claimed(self, k: int) -> str:
        """What round ``k``'s claim says (``restart ...`` or ``dead ...``); '' when none was made (yet)."""
        deadline = time.monotonic() + 5.0  # created, then written: the words follow within moments
        while True:
            try:
                text = self.down(k).read_text().strip()
            except OSError:
                return ""
            if text or time.monotonic() > deadline:
                return text
            time.sleep(0.1)

    def watch(self, k: int, child: subprocess.Popen, peer: threading.Event) -> threading.Thread:
        """While ``child`` (this task's guard) runs: once round ``k`` is claimed by another task, set ``peer``
        and stop ``child`` (its guard ends the command's tree)."""

        def loop() -> None:
            while child.poll() is None:
                if self.down(k).exists():
                    peer.set()
                    child.terminate()
                    return
                time.sleep(POLL_S)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        return thread

    def meet(self, k: int, asked: threading.Event, timeout: float = MEET_S) -> list[int]:
        """Say this task's command has ended for round ``k`` and wait for every other task's; returns the
        tasks that did not come within ``timeout`` (or before a stop was asked for)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"ended-{k}.{self.task}").write_text(f"{time.time():.3f}\n")
        deadline = time.monotonic() + timeout
        while True:
            missing = [t for t in self.tasks if not (self.folder / f"ended-{k}.{t}").exists()]
            if not missing or time.monotonic() > deadline or asked.wait(min(POLL_S / 2, 0.5)):
                return missing
