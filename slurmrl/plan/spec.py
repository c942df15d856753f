"""What the planner builds before it is a ``Plan``: typed, frozen component specs and the supervisor
that wraps each task's command.

An engine module (``slurmrl.plan.engines``) or a service builds a ``Spec``, whole: its placement,
health, instances and task (with its supervisor and command line) are decided when it is built.
The planner then only adds what needs every component at once (CPUs per task, srun options).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slurmrl.contract.argv import Supervise
from slurmrl.errors import UserError
from slurmrl.plan.model import Arg, Health, Instance, RoleSettings, Task
from slurmrl.recipe.user_set import user_set

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


def restart_of(section: Any) -> dict[str, Any]:
    """A serving section's restart policy (``restart``, ``max_restarts``, ``restart_backoff_s``: the
    ``slurmrl.recipe.restart`` fields) as the supervisor's words: it restarts the task in place."""
    return {"restart": section.restart, "max_restarts": section.max_restarts,
            "restart_backoff": section.restart_backoff_s}


RESTART_FIELDS = ("restart", "max_restarts", "restart_backoff_s")


def restart_unless_spanning(section: Any, where: str, spans: bool) -> dict[str, Any]:
    """``restart_of(section)`` for a server that is one task; an engine whose server spanning several nodes
    is not restarted in place (SGLang's: its ranks' restart as one worker is built and tested for vLLM only)
    refuses a restart field the recipe sets there rather than ignore it (``where``: the section's field path)."""
    if not spans:
        return restart_of(section)
    for name in RESTART_FIELDS:
        if user_set(section, name):
            raise UserError(f"{where}.{name}", "an SGLang server spanning several nodes is not restarted in place "
                            "(slurmrl restarts a multi-node worker as a whole for vLLM only): it fails fast; remove "
                            "the field")
    return {}


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
    orchestrated: bool = False  # RL's servers: the orchestrator decides whether the job goes on without them
    fail_fast: bool = True  # srun --kill-on-bad-exit
    slot: Slot | None = None  # a GPU component's slice: its CPUs are split by GPU count
    cpus_per_task: int = 0  # services name theirs; GPU components get a share of what is left
    settings: RoleSettings | None = None  # our own programs' typed settings (dumped where the run dir is written)
    mpi: str | None = None
    reads_model: bool = False  # its command names model.path (model.stage: it reads the node-local copy)
