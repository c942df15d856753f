"""Servers of another job that joined this one: ``RUN_DIR/joined/<jobid>.<task>.json``, one per server.

A joiner job (`slurmrl submit RECIPE --join RUN_DIR`) serves the main job's model with its secret; each of
its servers, once ready, writes its file here atomically (a private temporary, then one rename), so a
reader sees a whole file or none:

    {"url": "http://n5:12316", "job_id": "57", "node": "n5", "task": 0, "since": 1765071000.5}

The main job's orchestrator polls the folder (``slurmrl.runtime.orchestrator.joiners``) and `status` lists
them. A file is never removed by the joiner: a server that stops answering has left (its job ended or was
preempted), and the orchestrator's events say when. A leaf (standard library only).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slurmrl.contract import job_env
from slurmrl.rundir.atomic import write_text
from slurmrl.rundir.paths import RunDir

MAX_BYTES = 4096  # a file is ~120 bytes; a longer one is not ours


@dataclass(frozen=True)
class Joined:
    url: str
    job_id: str
    node: str
    task: int
    since: float = field(default_factory=time.time)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Joined:
        """One file back; ValueError where it is not one of ours."""
        data = json.loads(text)
        if not isinstance(data, dict) or set(data) != {"url", "job_id", "node", "task", "since"}:
            raise ValueError("a joined server's file has url, job_id, node, task and since")
        kinds: dict[str, type | tuple[type, ...]] = {"url": str, "job_id": str, "node": str, "task": int,
                                                     "since": (int, float)}
        for key, kind in kinds.items():
            if not isinstance(data[key], kind) or isinstance(data[key], bool):
                raise ValueError(f"joined server key {key!r} is of the wrong type")
        return cls(**data)


def register(run_dir: Path | str, joined: Joined) -> Path:
    """Write ``joined`` into the main run dir ``run_dir`` (all or nothing); its path."""
    path = RunDir(run_dir).joined_file(joined.job_id, joined.task)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, joined.to_json() + "\n", umask=0o022)
    return path


def register_from_env(url: str | None, task: int, env=None) -> Path | None:
    """Inside a joiner job's server step, once it is ready: its file in the main run dir (None: not a joiner)."""
    env = os.environ if env is None else env
    main = env.get(job_env.JOIN_RUN_DIR)
    if not main or not url:
        return None
    return register(main, Joined(url, env.get("SLURM_JOB_ID", ""), socket.gethostname(), task))


def read_all(run_dir: Path | str) -> list[Joined]:
    """Every well-formed joined server of ``run_dir``, oldest first (a bad or partial file is skipped)."""
    out = []
    for path in RunDir(run_dir).joined_dir.glob("*.json"):
        try:
            if os.path.getsize(path) > MAX_BYTES:
                continue
            out.append(Joined.from_json(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(out, key=lambda j: (j.since, j.job_id, j.task))
