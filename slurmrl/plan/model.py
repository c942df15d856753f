"""The plan: what runs where. Frozen models; ``plan.json`` is ``Plan.model_dump_json()``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Sh(Frozen):
    """A shell expression the planner wrote (e.g. ``${NODES_G0[0]}:${PORT_TORCH_RDZV}``).

    Rendered inside double quotes, so it expands once and is never word-split.
    User text never becomes an ``Sh``: user values are plain ``str`` and get single-quoted.
    """

    sh: str


Arg = str | Sh


class Directive(Frozen):
    option: str  # e.g. "--nodes"
    value: str | None = None  # None for flags such as --exclusive
    comment: str | None = None


class HetGroup(Frozen):
    index: int
    name: str
    nodes: int
    gpus_per_node: int
    cpus_per_node: int
    roles: tuple[str, ...]
    directives: tuple[Directive, ...]


class Instance(Frozen):
    """One task of a component: a server, a torchrun agent, a service."""

    rank: int
    node: int  # node index within the component's het group
    local: int  # task index on that node
    gpus: tuple[int, ...]  # GPU positions on the node (index into what Slurm gave the step)
    ports: dict[str, str]  # purpose -> port-table name, e.g. {"http": "server_0"}
    args: tuple[str, ...] = ()  # role arguments; {host:G:N} and {port:NAME} are filled in at run time
    env: dict[str, str] = {}


class Health(Frozen):
    """How the script decides a component is ready before the next stage starts."""

    kind: Literal["http", "tcp", "file"]
    ports: tuple[str, ...] = ()  # port-table names checked on each checked node
    path: str = "/health"
    first_node_only: bool = False
    timeout: int = 600


class Component(Frozen):
    name: str
    role: str  # runtime module: slurmrl.runtime.<role>
    group: int
    first_node: int  # relative node index within the het group
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int  # GPUs the step asks for on each node (0: none)
    overlap: bool  # shares its node's GPUs with another step
    stage: int
    main: bool  # the job succeeds when every main component exits 0
    checkpoints: bool  # gets the warning signal and may checkpoint
    srun: tuple[Arg, ...]  # srun options, before the container flags
    argv: tuple[Arg, ...]  # the command srun runs
    env: dict[str, str]
    health: Health | None
    instances: tuple[Instance, ...]
    settings: dict  # role settings written to components/<name>.toml


class Stage(Frozen):
    index: int
    title: str
    components: tuple[str, ...]


class Plan(Frozen):
    name: str
    kind: str
    job_name: str
    groups: tuple[HetGroup, ...]
    components: tuple[Component, ...]
    stages: tuple[Stage, ...]
    ports: dict[str, int]  # port-table name -> offset from PORT_BASE (only the ones used)
    port_base: int | None  # fixed base, else derived from the job id at run time
    container_flags: tuple[str, ...]
    python: tuple[str, ...]
    venv: str | None
    modules: tuple[str, ...]
    setup: tuple[str, ...]
    env: dict[str, str]
    services: tuple[str, ...]
    requeue: bool
    signal: str
    grace_seconds: int
    warnings: tuple[str, ...]

    def component(self, name: str) -> Component:
        return next(c for c in self.components if c.name == name)
