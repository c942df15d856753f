"""The plan: what runs where. Frozen models; ``plan.json`` is ``Plan.model_dump_json()``.

A component of our own programs carries its typed settings (``RoleSettings``) from the planner to where
the run dir's files are written: ``components/<name>.toml`` and ``plan.json`` hold their one serialized
form (``dump_settings``), and a stored ``plan.json`` reads them back as the same types (``SETTINGS``,
by the component's role). The plan's own schema does not include theirs (building them costs
``slurmrl plan`` a fifth of a second): a component holds the object the planner built, as it is."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import core_schema

from slurmrl.settings.orchestrator import OrchestratorSettings
from slurmrl.settings.trainer import TrainerSettings


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


RoleSettings = TrainerSettings | OrchestratorSettings  # the typed settings of our own programs
SETTINGS: dict[str, type[TrainerSettings] | type[OrchestratorSettings]] = {
    "trainer": TrainerSettings, "orchestrator": OrchestratorSettings}  # a component's role -> its settings' type


def dump_settings(s: RoleSettings) -> dict[str, Any]:
    """The one serialized form of a component's settings: ``components/<name>.toml`` and ``plan.json``."""
    return s.model_dump(mode="json", exclude_none=True)


def _held(value: object) -> RoleSettings | None:
    if value is None or isinstance(value, (TrainerSettings, OrchestratorSettings)):
        return value
    raise ValueError("give the typed settings of a trainer or orchestrator component")


class _AsBuilt:
    """A component's settings as the planner built them: checked for their type, not validated again;
    serialized by ``dump_settings``."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            _held, serialization=core_schema.plain_serializer_function_ser_schema(dump_settings, when_used="unless-none"))


class Sh(Frozen):
    """A shell expression the planner wrote (e.g. ``${NODES_G0[0]}:${PORT_TORCH_RDZV}``).

    Rendered inside double quotes, so it expands once and is never word-split.
    User text never becomes an ``Sh``: user values are plain ``str`` and get single-quoted.
    """

    sh: str


class Cat(Frozen):
    """One shell word glued from pieces: user text (single-quoted) and planner expressions
    (double-quoted), e.g. a JSON argument holding a per-task port."""

    parts: tuple[str | Sh, ...]


Arg = str | Sh | Cat


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
    claim_srun: tuple[Arg, ...] = ()  # srun options of the step that claims the job's ports on each node
    check_srun: tuple[Arg, ...] = ()  # the step that checks each node for an earlier job's leftovers (Dynamo)
    node_srun: tuple[Arg, ...] = ()  # the node check on each node: earlier jobs' leftovers ended, health probe


class Instance(Frozen):
    """One task of a component: a server, a torchrun agent, a service."""

    rank: int
    node: int  # node index within the component's het group
    local: int  # task index on that node
    gpus: tuple[int, ...]  # GPU positions on the node (index into what Slurm gave the step)
    ports: dict[str, str]  # purpose -> port-table name, e.g. {"http": "server_0"}


class Health(Frozen):
    """How a component's tasks show they are ready before the next stage starts.

    Each task's supervisor runs the check itself (``--ready URL``) and then writes its ready file
    (its URL and its step's task count); the batch shell waits for every task's file and checks
    each URL again from the batch host."""

    kind: Literal["http", "tcp"]
    ports: tuple[str, ...] = ()  # port-table names the tasks are checked on (for the summary)
    path: str = "/health"
    first_node_only: bool = False  # only the first node serves (wide-EP: the rest are headless)
    nodes_per_server: int = 1  # a server spans this many nodes; only the first of each serves
    timeout: int = 600
    urls_var: str | None = None  # the batch shell exports the ready URLs in this variable


class Task(Frozen):
    """What each task of a component runs: the body of ``task_<name>()`` in job.sbatch.

    ``prelude`` lines are shell the planner wrote from its own constants (never user text):
    per-task values from ``SLURM_NODEID``/``SLURM_LOCALID`` and the port table. ``env`` is
    exported, then ``exec supervisor -- command``: the engine's real command line."""

    prelude: tuple[str, ...] = ()
    env: tuple[tuple[str, Arg], ...] = ()
    supervisor: tuple[Arg, ...] = ()
    command: tuple[Arg, ...]


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
    critical: bool = True  # False: its exit is logged (a phase) and the job goes on (recipe: critical = false)
    # an RL job's servers: when every task is dead the script logs it and goes on; the orchestrator decides
    # from its live set (inference.min_servers) whether the job can continue
    orchestrated: bool = False
    srun: tuple[Arg, ...]  # srun options, before the container flags
    task: Task
    health: Health | None
    instances: tuple[Instance, ...]  # where each task lands (summary, status, preflight)
    settings: Annotated[RoleSettings | None, _AsBuilt] = None  # our own programs': components/<name>.toml
    mpi: str | None = None  # srun --mpi=<this>: the step's tasks are one MPI world (TRT-LLM ranks)

    @model_validator(mode="before")
    @classmethod
    def _typed_settings(cls, data: Any) -> Any:
        """A stored plan.json: its settings table read back as the type of the component's role."""
        if isinstance(data, dict) and isinstance(data.get("settings"), dict):
            kind = SETTINGS.get(data.get("role", ""))
            if kind is None:
                raise ValueError(f"settings of a component of role {data.get('role')!r}: only "
                                 f"{' and '.join(SETTINGS)} components have settings")
            return {**data, "settings": kind.model_validate(data["settings"])}
        return data

    @property
    def function(self) -> str:
        """The task function's name in job.sbatch."""
        return "task_" + self.name.replace("-", "_")


class Stage(Frozen):
    index: int
    title: str
    components: tuple[str, ...]


class StopStep(Frozen):
    """One step of a planned stop: TERM to these components, then up to ``seconds`` for them to exit
    (``full_grace``: the script's GRACE_SECONDS, slurm.grace_seconds, so an edit there applies)."""

    components: tuple[str, ...]
    seconds: int
    full_grace: bool


class ImageImport(Frozen):
    """container.cache: the batch shell imports ``image`` into ``sqsh`` once (enroot import under a
    lock on the shared folder); every step's --container-image is ``sqsh``."""

    image: str
    sqsh: str


class SlurmrlCheck(Frozen):
    """A job with a container: its first step runs the run dir's slurmrl-check.py in that container with
    the job's Python, and the job ends at once, in one line, when slurmrl there is missing or is not the
    one that rendered the script (``slurmrl.contract.slurmrl_check``)."""

    srun: tuple[Arg, ...]
    command: tuple[Arg, ...]
    log: str  # in LOG_DIR: what it printed (srun --output)
    prepare: tuple[Arg, ...] = ()  # run first, outside the container: makes the folder a mount needs


class StageStep(Frozen):
    """model.stage = "node-local": one task per node copies the model before the servers start."""

    group: int
    srun: tuple[Arg, ...]
    command: tuple[Arg, ...]
    prepare: tuple[Arg, ...] = ()  # run first, outside the container: makes the folder its mount needs


class Plan(Frozen):
    name: str
    kind: str
    preflight: bool = False  # every component runs slurmrl.runtime.steps.probe
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
    max_requeues: int = 3
    max_total_seconds: int | None = None
    signal: str
    grace_seconds: int
    stop_order: tuple[StopStep, ...] = ()  # reverse start order: callers before what they call
    warnings: tuple[str, ...]
    image_import: ImageImport | None = None  # container.cache
    slurmrl_check: SlurmrlCheck | None = None  # [container]: slurmrl in the image is the one that rendered this
    staging: tuple[StageStep, ...] = ()  # model.stage = "node-local"
    nvlink_domain: tuple[int, ...] = ()  # het groups whose nodes must share one NVLink domain (preflight)

    def component(self, name: str) -> Component:
        return next(c for c in self.components if c.name == name)
