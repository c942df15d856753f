"""What the planner builds before it is a ``Plan``: typed, frozen component specs and the supervisor
that wraps each task's command.

An engine module (``slurmrl.plan.engines``) or a service builds a ``Spec``, whole: its placement,
health, instances and task (with its supervisor and command line) are decided when it is built.
The planner then only adds what needs every component at once (CPUs per task, srun options).
"""

from __future__ import annotations

from dataclasses import dataclass

from slurmrl.contract.argv import Supervise
from slurmrl.plan.model import Arg, Health, Instance, Task

PROBE = "slurmrl.runtime.steps.probe"  # what every task runs in a preflight


@dataclass(frozen=True)
class Slot:
    """Where a GPU component goes: a run of nodes in a group and GPU positions on each."""

    group: int
    first_node: int
    nodes: int
    gpus: tuple[int, ...]
    shared: bool = False


Supervisor = Supervise  # the planner's words may be shell expressions: Supervise[Arg]


def supervisor_argv(python: tuple[str, ...], s: Supervise[Arg]) -> tuple[Arg, ...]:
    """The one place a ``Supervisor`` becomes words of job.sbatch (its command follows the ``--``)."""
    return (*python, "-m", Supervise.MODULE, *s.to_argv())


@dataclass(frozen=True)
class Spec:
    """One component as its builder decided it; the planner turns it into a ``model.Component``."""

    name: str
    role: str  # runtime module: slurmrl.runtime.<role>
    group: int
    first_node: int
    nodes: int
    tasks_per_node: int
    gpus_per_node: int  # GPUs the step asks for on each node (0: none)
    stage: int
    task: Task
    health: Health | None = None
    instances: tuple[Instance, ...] = ()
    main: bool = False  # the job succeeds when every main component exits 0
    critical: bool = True  # False (recipe: critical = false): its exit is logged and the job goes on
    fail_fast: bool = True  # srun --kill-on-bad-exit
    slot: Slot | None = None  # a GPU component's slice: its CPUs are split by GPU count
    cpus_per_task: int = 0  # services name theirs; GPU components get a share of what is left
    settings: dict | None = None
    mpi: str | None = None
    reads_model: bool = False  # its command names model.path (model.stage: it reads the node-local copy)
