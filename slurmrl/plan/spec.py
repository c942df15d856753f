"""What the planner builds before it is a ``Plan``: typed, frozen component specs and the supervisor
that wraps each task's command.

An engine module (``slurmrl.plan.engines``) or a service builds a ``Spec``, whole: its placement,
health, instances and task (with its supervisor and command line) are decided when it is built.
The planner then only adds what needs every component at once (CPUs per task, srun options).
"""

from __future__ import annotations

from dataclasses import dataclass

from slurmrl.plan.model import Arg, Health, Instance, Task

SUPERVISE = "slurmrl.runtime.steps.supervise"  # the step wrapper every task's command runs under
PROBE = "slurmrl.runtime.steps.probe"  # what every task runs in a preflight


@dataclass(frozen=True)
class Slot:
    """Where a GPU component goes: a run of nodes in a group and GPU positions on each."""

    group: int
    first_node: int
    nodes: int
    gpus: tuple[int, ...]
    shared: bool = False


@dataclass(frozen=True)
class Supervisor:
    """``python -m slurmrl.runtime.steps.supervise NAME [options] --``: readiness, ready file, signals.

    ``ready``: the URL it checks (or ``started``); ``ready_completion``: the served model it asks
    for one completion once the URL answers (ready means serving); ``ready_model`` and
    ``ready_instances``: Dynamo's frontend lists the model with that many workers; ``ready_workers``:
    vllm-router has every worker registered."""

    name: str
    gpus: Arg | None = None  # FIRST:COUNT GPU positions of the task
    ready: Arg | None = None
    heartbeat: int = 0
    cuda_runtime: bool = False
    ready_model: str | None = None
    ready_instances: int | None = None
    ready_workers: Arg | None = None
    ready_completion: str | None = None
    fail_on: tuple[str, ...] = ()  # the recipe's failure probes for this component (regexes)


def supervisor_argv(python: tuple[str, ...], s: Supervisor) -> tuple[Arg, ...]:
    """The one place a ``Supervisor`` becomes words of job.sbatch."""
    argv: list[Arg] = [*python, "-m", SUPERVISE, s.name]
    if s.gpus is not None:
        argv += ["--gpus", s.gpus]
    if s.ready is not None:
        argv += ["--ready", s.ready]
    if s.heartbeat:
        argv += ["--heartbeat", str(s.heartbeat)]
    if s.cuda_runtime:
        argv.append("--cuda-runtime")
    if s.ready_model is not None:
        argv += ["--ready-model", s.ready_model]
    if s.ready_instances is not None:
        argv += ["--ready-instances", str(s.ready_instances)]
    if s.ready_workers is not None:
        argv += ["--ready-workers", s.ready_workers]
    if s.ready_completion is not None:
        argv += ["--ready-completion", s.ready_completion]
    for pattern in s.fail_on:
        argv += ["--fail-on", pattern]
    return (*argv, "--")


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
