"""The run dir's step-numbered files, shared by trainer and orchestrator (no torch here).

``rollouts/step-NNNNNN.json``, ``weights/step-NNNNNN/`` (complete once ``READY`` exists) and
``checkpoints/step-NNNNNN/`` (complete once ``DONE`` exists). Writers build under a temporary
name and rename, so a reader never sees half a step.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

STEP_DIR = re.compile(r"^step-(\d{6,})$")


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def rollout_path(run_dir: Path, step: int) -> Path:
    return run_dir / "rollouts" / f"{step_name(step)}.json"


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
