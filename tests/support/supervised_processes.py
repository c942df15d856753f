"""Processes started under the step supervisor on loopback, and waits on them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import polling
import psutil

SUPERVISE = [sys.executable, "-m", "slurmrl.runtime.steps.supervise"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    full = {**os.environ, "SLURMRL_RUN_DIR": str(tmp_path), "SLURMRL_ATTEMPT": "0", "SLURM_PROCID": "0",
            "SLURM_STEP_NUM_TASKS": "1", **(env or {})}
    return subprocess.Popen([*SUPERVISE, *args], env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(predicate, timeout: float = 20):
    """``polling.wait_for`` with this module's deadline and a short poll (processes on loopback)."""
    return polling.wait_for(predicate, timeout=timeout, poll=0.1)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
