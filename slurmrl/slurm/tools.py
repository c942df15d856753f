"""Running Slurm's client commands: one place that turns their failures into one-line errors.

Every Slurm command slurmrl runs goes through :func:`call` (submitit's sacct through
``transport().argv``; both check the job ids they name), and :func:`call` through the command's transport: :class:`Local` (this machine, the default) or, for ``--cluster NAME``, the SSH
transport of ``slurmrl.remote`` (one multiplexed OpenSSH connection to the cluster's login node).
A transport also says where the cluster sees a run dir (``place``), copies it there before a
submit (``push``), brings the job's outputs back before they are read (``pull``), and runs
``attach``'s interactive ``srun`` (``exec``). Locally all of these are the identity or nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from slurmrl import pydantic_plugins
from slurmrl.errors import UserError
from slurmrl.rundir.jobids import check_argv

TIMEOUT_S = 60


class Local:
    """Slurm's client commands on this machine; a run dir is where the job sees it."""

    name: str | None = None  # the cluster's name (None: here)

    def run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  env=pydantic_plugins.child_env())
        except FileNotFoundError:
            raise UserError(None, f"{argv[0]} not found on PATH; run slurmrl where Slurm's client commands are") from None

    def argv(self, argv: list[str]) -> list[str]:
        """The command line that runs ``argv`` there (for code that runs it itself: submitit's sacct)."""
        check_argv(argv)
        return argv

    def place(self, run_dir: Path) -> Path:
        """The run dir's path where the job runs."""
        return run_dir

    def push(self, run_dir: Path, only: list[str] | None = None) -> None:
        """Copy the run dir (or ``only`` these files of it) to where the job runs."""

    def pull(self, run_dir: Path) -> None:
        """Bring the job's outputs (logs, ready files, reports) back into the run dir."""

    def exec(self, argv: list[str], env: dict[str, str], pty: bool) -> None:
        """Replace this process with ``argv`` (attach's srun)."""
        check_argv(argv)
        if shutil.which(argv[0]) is None:
            raise UserError(None, f"{argv[0]} not found on PATH; run slurmrl where Slurm's client commands are")
        os.execvpe(argv[0], argv, env)

    def close(self) -> None:
        pass


_current: Local = Local()


def transport() -> Local:
    """Where this command's Slurm commands run (``--cluster NAME`` sets it)."""
    return _current


@contextlib.contextmanager
def using(t: Local):
    """Run Slurm commands through ``t`` inside the block; closes ``t`` after it."""
    global _current
    previous, _current = _current, t
    try:
        yield t
    finally:
        _current = previous
        t.close()


def call(argv: list[str], check: bool = True, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run a Slurm command, text output. ``check``: a non-zero exit is a UserError naming the command
    with its first stderr line (Slurm's own words), e.g. ``sbatch: Invalid partition name specified``.
    Every job id in ``argv`` is checked first (slurmrl.rundir.jobids): one read back from a run dir
    never reaches a Slurm command as an option."""
    check_argv(argv)
    where = transport()
    try:
        r = where.run(argv, timeout)
    except subprocess.TimeoutExpired:
        on = f" on cluster {where.name}" if where.name else ""
        raise UserError(None, f"{argv[0]}{on} did not answer within {timeout:.0f}s; is slurmctld up?") from None
    if check and r.returncode != 0:
        raise UserError(None, first_error(argv[0], r))
    return r


def first_error(cmd: str, r: subprocess.CompletedProcess) -> str:
    lines = [ln.strip() for ln in (r.stderr or r.stdout or "").splitlines() if ln.strip()]
    text = lines[-1] if lines else f"exited with code {r.returncode}"
    return text if text.startswith(cmd) else f"{cmd}: {text}"


def out(argv: list[str]) -> str:
    return call(argv).stdout


def hostnames(nodelist: str) -> list[str]:
    """``n[1-3],m1`` -> ``[n1, n2, n3, m1]`` in Slurm's order (the order the job script sees)."""
    if not nodelist or nodelist in ("None assigned", "(null)"):
        return []
    return out(["scontrol", "show", "hostnames", nodelist]).split()
