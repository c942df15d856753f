"""The job's secret: every request to its vLLM servers (and, through them, its router) carries
``Authorization: Bearer <secret>``. A leaf (standard library only).

The job script creates ``RUN_DIR/secret`` (mode 0600, in the 0700 run dir) once and exports only
its path as ``SLURMRL_SECRET_FILE``: the secret itself is never in job.sbatch, plan.json,
components/*.toml, a command line or a log. Programs of the job read it through the variable;
commands on the login node read it from the run dir.
"""

from __future__ import annotations

import os
from pathlib import Path

from slurmrl.contract import job_env

ENV = job_env.SECRET_FILE
FILE = "secret"


def path_from_env(env=None) -> Path | None:
    env = os.environ if env is None else env
    value = env.get(ENV)
    return Path(value) if value else None


def read(path: Path | str | None = None) -> str | None:
    """The secret from ``path`` (default: ``$SLURMRL_SECRET_FILE``), or None when there is none."""
    path = Path(path) if path else path_from_env()
    if path is None:
        return None
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def headers(path: Path | str | None = None) -> dict[str, str]:
    """The Authorization header for the job's servers (empty when the job has no secret)."""
    value = read(path)
    return {"Authorization": f"Bearer {value}"} if value else {}
