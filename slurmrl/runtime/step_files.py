"""The run dir's step-numbered files, shared by trainer and orchestrator (no torch here).

``rollouts/step-NNNNNN.json``, ``weights/step-NNNNNN/`` (complete once ``READY`` exists) and
``checkpoints/step-NNNNNN/`` (complete once ``DONE`` exists). Writers build under a temporary
name and rename, so a reader never sees half a step.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from slurmrl import heartbeat
from slurmrl.rundir.paths import RunDir

STEP_DIR = re.compile(r"^step-(\d{6,})$")


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def rollout_path(run_dir: Path, step: int) -> Path:
    return RunDir(run_dir).rollouts / f"{step_name(step)}.json"


def complete_steps(root: Path, marker: str) -> list[tuple[int, Path]]:
    """(step, folder) of every complete folder under root, oldest first."""
    out = []
    if root.is_dir():
        for d in root.iterdir():
            m = STEP_DIR.match(d.name)
            if m and (d / marker).exists():
                out.append((int(m.group(1)), d))
    return sorted(out)


def latest(root: Path, marker: str) -> tuple[int, Path | None]:
    """The newest complete folder under root, or (0, None)."""
    done = complete_steps(root, marker)
    return done[-1] if done else (0, None)


def write_json_atomic(path: Path, data, indent: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=indent))
    tmp.replace(path)


def wait_until(ready: Callable[[], bool], stop: threading.Event, log: Callable[[str], None], what: str,
               poll: float = 0.5, every: float = 30.0) -> float | None:
    """Poll ``ready()`` until it is true (returns the seconds waited) or ``stop`` is set (returns
    None), saying every ``every`` seconds that it is still waiting for ``what``."""
    t0 = time.perf_counter()
    next_log = every
    while not ready():
        heartbeat.beat()  # waiting is progress too: a hung program stops beating here
        if stop.wait(poll):
            return None
        waited = time.perf_counter() - t0
        if waited >= next_log:
            log(f"still waiting for {what} ({waited:.0f}s)")
            next_log += every
    return time.perf_counter() - t0
