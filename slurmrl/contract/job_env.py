"""The job's environment variables: every ``SLURMRL_*`` name the job script exports (or a test or
user sets) and a program inside a job step reads, spelled once, with the readers of the few that
need more than ``env.get``.

The templates (``slurmrl/templates``) write the exports; ``tests/test_contract_env.py`` checks that
every ``SLURMRL_*`` word there is one of these names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# exported by the job script (slurmrl-functions.sh, _ports.j2, job.sbatch.j2)
RUN_DIR = "SLURMRL_RUN_DIR"  # the run dir, absolute
ATTEMPT = "SLURMRL_ATTEMPT"  # this attempt of the job (requeues count up): attempts/<n>/
JOB_END = "SLURMRL_JOB_END"  # the allocation's end, epoch seconds (empty when unlimited)
SECRET_FILE = "SLURMRL_SECRET_FILE"  # the job's secret (RUN_DIR/secret), never the secret itself
PORT_BASE = "SLURMRL_PORT_BASE"  # the port table's base: a port is PORT_BASE + its offset
JOIN_RUN_DIR = "SLURMRL_JOIN_RUN_DIR"  # a joiner job's servers register in this run dir (slurmrl.rundir.joined)
NODES_PREFIX = "SLURMRL_NODES_G"  # + het group index: that group's hosts, space-separated
# set for one program by the script or its supervisor
METRICS_PORT = "SLURMRL_METRICS_PORT"  # where the trainer/orchestrator serves /metrics (with [collector])
HEARTBEAT_FILE = "SLURMRL_HEARTBEAT_FILE"  # the file a program touches to say it makes progress
# set by a person or a test, read inside the job
TRAINER_DEVICE = "SLURMRL_TRAINER_DEVICE"  # "cpu": keep the trainer off the GPUs
PROBE_TIMEOUT = "SLURMRL_PROBE_TIMEOUT"  # seconds a preflight probe waits for the others (default 300)
PORT_CLAIMS = "SLURMRL_PORT_CLAIMS"  # the folder of the script's port claims (default /dev/shm/slurmrl-ports)
PYXIS_TEST_DOUBLE = "SLURMRL_PYXIS_TEST_DOUBLE"  # only tests/support/pyxis_double sets it; real Pyxis never does
VERIFIERS_V1_PYTHON = "SLURMRL_VERIFIERS_V1_PYTHON"  # verifiers v1 tasksets' Python (default .venv-verifiers)
JOB_IDS = "SLURMRL_JOB_IDS"  # the node check: every job id of this run (its earlier attempts' tasks are leftovers)
TEST_CHECKPOINT_PAUSE = "SLURMRL_TEST_CHECKPOINT_PAUSE_S"  # test hook: seconds a rank sleeps after each checkpoint file

EXPORTED = (RUN_DIR, ATTEMPT, JOB_END, SECRET_FILE, PORT_BASE, METRICS_PORT)
NAMES = (*EXPORTED, HEARTBEAT_FILE, TRAINER_DEVICE, PROBE_TIMEOUT, PORT_CLAIMS, PYXIS_TEST_DOUBLE,
         VERIFIERS_V1_PYTHON, JOB_IDS, TEST_CHECKPOINT_PAUSE)

NOT_IN_JOB = "run this inside the job script"


def nodes_of_group(group: int) -> str:
    """The name of het group ``group``'s host list (``SLURMRL_NODES_G<group>``)."""
    return f"{NODES_PREFIX}{group}"


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def in_job(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs inside a job script (it exports the run dir)."""
    return bool(_env(env).get(RUN_DIR))


def run_dir_from_env(env: Mapping[str, str] | None = None) -> str:
    """The run dir of the job this step belongs to; outside a job script, exits with one line."""
    value = _env(env).get(RUN_DIR)
    if not value:
        raise SystemExit(f"slurmrl: {RUN_DIR} is not set; {NOT_IN_JOB}")
    return value


def attempt_from_env(env: Mapping[str, str] | None = None) -> str:
    """This attempt's number as the script exports it ("0" outside a job)."""
    return _env(env).get(ATTEMPT, "0")


def hosts_of_group(group: int, env: Mapping[str, str] | None = None) -> list[str]:
    """Het group ``group``'s hosts; outside a job script, exits with one line."""
    value = _env(env).get(nodes_of_group(group))
    if value is None:
        raise SystemExit(f"slurmrl: {nodes_of_group(group)} is not set; {NOT_IN_JOB}")
    return value.split()


def port_base(env: Mapping[str, str] | None = None) -> int | None:
    """The port table's base the script exported; None when it did not."""
    value = _env(env).get(PORT_BASE, "")
    return int(value) if value.isdigit() else None


def job_end(env: Mapping[str, str] | None = None) -> float | None:
    """The allocation's end (epoch seconds); None when unlimited, unknown or not a number."""
    value = _env(env).get(JOB_END, "").strip()
    try:
        return float(value) if value else None
    except ValueError:
        return None


def trainer_on_cpu(env: Mapping[str, str] | None = None) -> bool:
    """``SLURMRL_TRAINER_DEVICE=cpu``: keep the trainer off the GPUs (tests, a debug run)."""
    return _env(env).get(TRAINER_DEVICE, "") == "cpu"


def probe_timeout(env: Mapping[str, str] | None = None) -> float:
    return float(_env(env).get(PROBE_TIMEOUT, "300"))
