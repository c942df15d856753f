"""The trainer's ready files (no torch here): ``ready/attempt-N/trainer.<node>``, one per node.

Written by each node's first process once the model is loaded and stale weights are gone (the
orchestrator waits for ``trainer.0`` before it reads published weights). Ranks come from
torchrun's environment: ``GROUP_RANK`` is the node, ``WORLD_SIZE / LOCAL_WORLD_SIZE`` the nodes
(the step's tasks: one torchrun per node). Started without torchrun: node 0 of 1.
"""

from __future__ import annotations

import os
from pathlib import Path

from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import write_ready


def mark_ready(run_dir: Path, env=None) -> Path | None:
    env = os.environ if env is None else env
    if int(env.get("LOCAL_RANK", 0)) != 0:
        return None
    node = int(env.get("GROUP_RANK", 0))
    nodes = max(1, int(env.get("WORLD_SIZE", 1)) // max(1, int(env.get("LOCAL_WORLD_SIZE", 1))))
    path = RunDir(run_dir).ready_file(RunDir.attempt_from_env(env), "trainer", node)
    write_ready(path, None, nodes)
    return path
