"""Pytest plugin: a real local Slurm cluster (slurmrl/localcluster/cluster.sh) per session.

Fixture ``slurm_cluster`` (session scope) runs ``cluster.sh up`` on a fixed state dir
(``$SLURMRL_TEST_CLUSTER_DIR`` or /tmp/slurmrl-test-cluster, so reruns are fast) and yields
a :class:`SlurmCluster`. If the cluster cannot start the fixture FAILS with the log tail;
it never skips. Teardown runs ``cluster.sh down`` unless ``SLURMRL_KEEP_CLUSTER=1`` or the
cluster was already running before this session (then it is left as it was found: the
cluster is machine-wide, and another session may be using it).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from slurmrl.localcluster import cluster_env, script_args

STATE_DIR = Path(os.environ.get("SLURMRL_TEST_CLUSTER_DIR", "/tmp/slurmrl-test-cluster"))


@dataclass
class SlurmCluster:
    state_dir: Path
    cluster_vars: dict[str, str]  # just what clients need (SLURM_CONF, ...)
    env: dict[str, str] = field(init=False)  # os.environ + cluster_vars: pass as env=

    def __post_init__(self) -> None:
        self.env = {**os.environ, **self.cluster_vars}

    def run(self, cmd: str | list[str], **kw) -> subprocess.CompletedProcess:
        """Run ``cmd`` (a str goes through the shell) with the cluster env; text output."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 120)
        kw["env"] = {**self.env, **kw.get("env", {})}
        return subprocess.run(cmd, shell=isinstance(cmd, str), **kw)

    def log_tail(self, name: str = "slurmctld.log", lines: int = 30) -> str:
        path = self.state_dir / "log" / name
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


@pytest.fixture(scope="session")
def slurm_cluster():
    was_up = subprocess.run(script_args("status", STATE_DIR), capture_output=True).returncode == 0
    up = subprocess.run(script_args("up", STATE_DIR), capture_output=True, text=True, timeout=900)
    if up.returncode != 0:
        pytest.fail(
            f"local Slurm cluster did not start (rc={up.returncode}):\n{up.stdout}\n{up.stderr}",
            pytrace=False,
        )
    yield SlurmCluster(STATE_DIR, cluster_env(STATE_DIR))
    if not was_up and os.environ.get("SLURMRL_KEEP_CLUSTER") != "1":
        subprocess.run(script_args("down", STATE_DIR), capture_output=True, timeout=300)
