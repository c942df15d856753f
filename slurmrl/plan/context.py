"""The planner's working state while it places a recipe: het groups, GPU slots, component specs.

Builders (``slurmrl.plan.engines``, services, training) read the recipe from it and add frozen
``Spec`` objects; nothing here re-reads a command line once it is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slurmrl.errors import UserError
from slurmrl.plan import staging
from slurmrl.plan.model import Arg, Cat, StageStep, Task
from slurmrl.plan.spec import PROBE, Slot, Spec, Supervisor, supervisor_argv
from slurmrl.recipe.inference import Inference
from slurmrl.recipe.judge import Judge
from slurmrl.recipe.orchestrator import Orchestrator
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.trainer import Trainer


@dataclass
class Group:
    """A het group while it fills: the roles on it and CPUs services take on each node."""

    index: int
    name: str
    nodes: int
    gpus_per_node: int
    roles: list[str] = field(default_factory=list)
    reserved: dict[int, int] = field(default_factory=dict)  # node -> CPUs taken by services


class Context:
    """What every builder gets: the recipe, where the job runs, and what was placed so far."""

    def __init__(self, r: Recipe, run_dir: str, preflight: bool):
        self.r = r
        self.run_dir = run_dir
        self.preflight = preflight
        self.groups: list[Group] = []
        self.specs: list[Spec] = []
        self.warnings: list[str] = []
        self.slots: dict[str, Slot] = {}
        self.staging: tuple[StageStep, ...] = ()  # model.stage: the copy steps (slurmrl.plan.staging)
        # server component -> worker processes of each of its servers, which join a weight broadcast (its engine says)
        self.weight_ranks: dict[str, int] = {}
        self.py: tuple[str, ...] = (
            ("uv", "run", "--project", r.python.uv_project, r.python.executable)
            if r.python.uv_project
            else (r.python.executable,)
        )

    # ---- the recipe's optional sections, for the builders that run only when it has them ----
    # (the planner calls them so; slurmrl.plan.rules.check_sections has checked the kind's sections)

    @property
    def inference(self) -> Inference:
        assert self.r.inference is not None, "built only for a recipe with [inference]"
        return self.r.inference

    @property
    def judge(self) -> Judge:
        assert self.r.judge is not None, "built only for a recipe with [judge]"
        return self.r.judge

    @property
    def trainer(self) -> Trainer:
        assert self.r.trainer is not None, "built only for a recipe with [trainer]"
        return self.r.trainer

    @property
    def orchestrator(self) -> Orchestrator:
        assert self.r.orchestrator is not None, "built only for a recipe with [orchestrator]"
        return self.r.orchestrator

    # ---- groups and components ----------------------------------------------------------
    def group(self, name: str, nodes: int, gpus_per_node: int) -> Group:
        g = Group(len(self.groups), name, nodes, gpus_per_node)
        self.groups.append(g)
        return g

    def reserve(self, g: Group, node: int, cpus: int, what: str) -> None:
        g.reserved[node] = g.reserved.get(node, 0) + cpus
        if g.reserved[node] >= self.r.slurm.cpus_per_node and g.gpus_per_node > 0:
            raise UserError(
                "slurm.cpus_per_node",
                f"{self.r.slurm.cpus_per_node} CPUs per node leave nothing for the GPU steps on node {node} "
                f"of group {g.name!r} after {what}; raise it",
            )

    def add(self, spec: Spec) -> None:
        g = self.groups[spec.group]
        label = spec.name if spec.role == "inference" else spec.role
        if label not in g.roles:
            g.roles.append(label)
        self.specs.append(spec)

    def spec(self, name: str) -> Spec:
        return next(c for c in self.specs if c.name == name)

    def has(self, name: str) -> bool:
        return any(c.name == name for c in self.specs)

    # ---- what each task runs ------------------------------------------------------------
    def task(self, supervisor: Supervisor, command: tuple[Arg, ...] | list[Arg], prelude=(), env=()) -> Task:
        """The task function's body; in a preflight every component runs the probe instead."""
        if self.preflight:
            return Task(env=tuple(env), command=(*self.py, "-m", PROBE, supervisor.name))
        return Task(prelude=tuple(prelude), env=tuple(env), supervisor=supervisor_argv(self.py, supervisor),
                    command=tuple(command))

    @property
    def serving_is_main(self) -> bool:
        """The servers end the job, unless a benchmark that stops it does (``then = "stop"``)."""
        return self.r.benchmark is None or self.r.benchmark.then != "stop"

    def model_path(self) -> str | Cat:
        """What a server's ``--model`` names for ``model.path``: the node-local copy with ``model.stage``."""
        return staging.local_copy(self.r) if self.r.model.stage == "node-local" else self.r.model.path
