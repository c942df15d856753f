"""A local Slurm cluster for tests and for trying recipes without a real cluster.

The work is done by ``cluster.sh`` (next to this file; needs root and Debian/Ubuntu):
``python -m slurmrl.localcluster up|down|status|env|purge [--state-dir DIR]``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).with_name("cluster.sh")
OWNER_FILE = Path("/run/slurmrl-localcluster.owner")  # cluster.sh's OWNER: the state dir of the cluster that is up


def running_state_dir() -> Path | None:
    """The state dir of the local cluster that is up on this machine (there is at most one), if any."""
    try:
        text = OWNER_FILE.read_text().strip()
    except OSError:
        return None
    return Path(text) if text else None


def default_state_dir() -> Path:
    """``$SLURMRL_CLUSTER_DIR`` or ``~/.cache/slurmrl/cluster``."""
    env = os.environ.get("SLURMRL_CLUSTER_DIR")
    return Path(env) if env else Path.home() / ".cache" / "slurmrl" / "cluster"


def script_args(command: str, state_dir: str | os.PathLike | None = None) -> list[str]:
    """The argv that runs ``cluster.sh <command>`` on ``state_dir``."""
    args = ["bash", str(SCRIPT), command]
    if state_dir is not None:
        args += ["--state-dir", str(state_dir)]
    return args


def cluster_env(state_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """Environment variables clients (sinfo, sbatch, srun, sacct) need for this cluster."""
    out = subprocess.run(
        script_args("env", state_dir), check=True, capture_output=True, text=True
    ).stdout
    env = {}
    for line in out.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, _, value = words[1].partition("=")
            env[key] = value
    return env
