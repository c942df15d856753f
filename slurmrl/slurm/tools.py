"""Running Slurm's client commands: one place that turns their failures into one-line errors."""

from __future__ import annotations

import subprocess

from slurmrl import pydantic_plugins
from slurmrl.errors import UserError

TIMEOUT_S = 60


def call(argv: list[str], check: bool = True, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run a Slurm command, text output. ``check``: a non-zero exit is a UserError naming the command
    with its first stderr line (Slurm's own words), e.g. ``sbatch: Invalid partition name specified``."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=pydantic_plugins.child_env())
    except FileNotFoundError:
        raise UserError(None, f"{argv[0]} not found on PATH; run slurmrl where Slurm's client commands are") from None
    except subprocess.TimeoutExpired:
        raise UserError(None, f"{argv[0]} did not answer within {timeout:.0f}s; is slurmctld up?") from None
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
