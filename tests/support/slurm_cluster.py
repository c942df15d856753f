"""Pytest plugin: a real local Slurm cluster (slurmrl/localcluster/cluster.sh) per session.

Fixture ``slurm_cluster`` (session scope) runs ``cluster.sh up`` on a fixed state dir
(``$SLURMRL_TEST_CLUSTER_DIR`` or /tmp/slurmrl-test-cluster, so reruns are fast) and yields
a :class:`SlurmCluster`. There is one local cluster per machine: when one is already up in
another state dir (say the demo's) and ``$SLURMRL_TEST_CLUSTER_DIR`` is not set, the tests use
that one rather than fail. If the cluster cannot start the fixture FAILS with the log tail;
it never skips. Teardown runs ``cluster.sh down`` unless ``SLURMRL_KEEP_CLUSTER=1`` or the
cluster was already running before this session (then it is left as it was found: the
cluster is machine-wide, and another session may be using it).

Under pytest-xdist every worker runs the fixture; ``cluster.sh`` serialises ``up`` on the state
dir, and no worker takes the cluster down (one finishing early would pull it from under the
others): the controller does, at the end of the session, when the cluster was not up before it.
A test that uses ``slurm_cluster`` is marked ``cluster`` by tests/conftest.py; one that uses
``slurm_debug2`` sends its jobs to the cluster's second partition and is marked ``debug2`` too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from slurmrl.localcluster import cluster_env, running_state_dir, script_args


def state_dir() -> Path:
    if os.environ.get("SLURMRL_TEST_CLUSTER_DIR"):
        return Path(os.environ["SLURMRL_TEST_CLUSTER_DIR"])
    return running_state_dir() or Path("/tmp/slurmrl-test-cluster")


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

    def on_partition(self, name: str) -> SlurmCluster:
        """The same cluster, with every sbatch, salloc and srun run through it sent to partition
        ``name`` (their *_PARTITION variables override a script's ``#SBATCH --partition``)."""
        chosen = {var: name for var in ("SBATCH_PARTITION", "SALLOC_PARTITION", "SLURM_PARTITION")}
        return SlurmCluster(self.state_dir, {**self.cluster_vars, **chosen})

    def slurmrl(self, *args: str, **kw) -> subprocess.CompletedProcess:
        """``python -m slurmrl ARGS`` against this cluster (keywords as for ``run``)."""
        return self.run([sys.executable, "-m", "slurmrl", *args], **kw)

    @staticmethod
    def job_processes(job_id: str | int) -> list[str]:
        """Every process on this machine (all nodes of the local cluster live here) whose
        environment says it belongs to job ``job_id``: ``pid cmdline`` each."""
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                env = proc.joinpath("environ").read_bytes().split(b"\0")
                if f"SLURM_JOB_ID={job_id}".encode() in env:
                    cmd = proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    found.append(f"{proc.name} {cmd[:200]}")
            except OSError:
                continue
        return found

    def wait_no_job_processes(self, job_id: str | int, timeout: float = 60) -> list[str]:
        """Wait until no process of the job is left; returns what is left at the deadline."""
        deadline = time.monotonic() + timeout
        while (left := self.job_processes(job_id)) and time.monotonic() < deadline:
            time.sleep(1)
        return left

    def log_tail(self, name: str = "slurmctld.log", lines: int = 30) -> str:
        path = self.state_dir / "log" / name
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


WAS_UP = pytest.StashKey[bool]()  # the xdist controller's: was the cluster up when the session began


def is_up(where: Path, tries: int = 3) -> bool:
    """``cluster.sh status`` says the cluster is up, asked up to ``tries`` times a second apart: a status
    read once under load can miss a running cluster, and a session that thinks it started the cluster
    takes it down at its end, from under every other session using it."""
    for attempt in range(tries):
        if subprocess.run(script_args("status", where), capture_output=True, timeout=120).returncode == 0:
            return True
        if attempt + 1 < tries:
            time.sleep(1)
    return False


def take_down(where: Path) -> None:
    if os.environ.get("SLURMRL_KEEP_CLUSTER") != "1":
        subprocess.run(script_args("down", where), capture_output=True, timeout=300)


def xdist_controller(config: pytest.Config) -> bool:
    """True in the process that hands tests to pytest-xdist's workers (and runs none itself)."""
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))


def pytest_configure(config: pytest.Config) -> None:
    if xdist_controller(config):
        config.stash[WAS_UP] = is_up(state_dir())


def pytest_unconfigure(config: pytest.Config) -> None:
    if xdist_controller(config) and WAS_UP in config.stash and not config.stash[WAS_UP] and is_up(state_dir()):
        take_down(state_dir())


@pytest.fixture(scope="session")
def slurm_cluster():
    where = state_dir()
    was_up = is_up(where)
    up = subprocess.run(script_args("up", where), capture_output=True, text=True, timeout=900)
    if up.returncode != 0:
        pytest.fail(
            f"local Slurm cluster did not start (rc={up.returncode}):\n{up.stdout}\n{up.stderr}",
            pytrace=False,
        )
    yield SlurmCluster(where, cluster_env(where))
    if not was_up and not os.environ.get("PYTEST_XDIST_WORKER"):
        take_down(where)


SECOND_PARTITION = "debug2"  # cluster.sh: n5-n8, the same shape as debug's n1-n4


@pytest.fixture
def slurm_debug2(slurm_cluster):
    """The local cluster, its jobs sent to the second partition (debug2: n5-n8). A test that uses
    it is marked ``cluster`` and ``debug2`` and runs in the second cluster stream
    (tests/support/xdist_groups.py), beside the tests on debug; neither waits for the other's nodes. For
    tests that name no node and whose jobs fit in four nodes."""
    return slurm_cluster.on_partition(SECOND_PARTITION)
