"""Where this task is in the plan: its component and instance in RUN_DIR/plan.json, its hosts
and ports. Used by the preflight probe, which stands in for a component with the same srun
layout and must know what the plan expected of it.

A component is one ``srun``; its tasks find their instance by ``SLURM_NODEID`` (node index
within the step) and ``SLURM_LOCALID`` (task index on the node). The script exports the hosts
of each het group as ``SLURMRL_NODES_G<n>`` and the port table's base as ``SLURMRL_PORT_BASE``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from slurmrl import ports
from slurmrl.contract import job_env
from slurmrl.contract.reader import ContractError
from slurmrl.contract.views import ComponentView, InstanceView, PlanView
from slurmrl.rundir.paths import RunDir


@dataclass(frozen=True)
class Component:
    config: ComponentView  # the component in plan.json
    instance: InstanceView
    run_dir: Path
    plan: PlanView

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def rank(self) -> int:
        return self.instance.rank


def load(name: str, env: Mapping[str, str] | None = None) -> Component:
    env = os.environ if env is None else env
    run_dir = RunDir.from_env(env).path
    path = RunDir(run_dir).plan
    try:
        plan = PlanView.from_json(json.loads(path.read_text()), str(path))
    except ContractError as e:
        raise SystemExit(f"slurmrl: {e}") from None
    except (OSError, ValueError) as e:
        raise SystemExit(f"slurmrl: {path}: {e}") from None
    config = plan.component(name)
    if config is None:
        raise SystemExit(f"slurmrl: no component {name!r} in {path}")
    node = int(env.get("SLURM_NODEID", 0))
    local = int(env.get("SLURM_LOCALID", 0))
    inst = config.instance_at(node, local)
    if inst is None:
        raise SystemExit(f"slurmrl: {name}: the plan has no task for node {node} task {local}")
    return Component(config, inst, run_dir, plan)


def hosts(group: int, env: Mapping[str, str] | None = None) -> list[str]:
    return job_env.hosts_of_group(group, env)


def port(name: str, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    return int(env[job_env.PORT_BASE]) + ports.offset(name)
