"""The recipe: what the user wants, as pydantic models, one module per section.

Unknown keys are errors (``extra="forbid"``). Every field carries a description;
``docs/recipe-reference.md`` is generated from them (``python -m slurmrl.recipe.reference``)
and a test fails when a field is missing there. Cross-field topology rules live in the
planner, not here: the sections only check what one field can check on its own, plus one
whole-job size cap (``job_gpus``) so that no plan grows with an absurd number.

Every number has a range, stated in its field's description (a test checks the two agree) and
chosen from what Slurm, vLLM and the largest clusters really allow (``slurmrl.settings.limits``).
Non-finite floats (``inf``, ``nan``, ``1e999``) are refused by every section.

The optional sections most recipes leave out and the engines' [inference] sections are ``OnDemand``
(``slurmrl.recipe.schema``): their models are built the first time a recipe holds one, not with the
recipe's own (`slurmrl plan`'s start-up).

The fields the trainer, orchestrator and judge programs read are their settings' bases
(``slurmrl.settings``), which the sections here extend: each default is written once.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from slurmrl.errors import UserError
from slurmrl.recipe.benchmark import Benchmark
from slurmrl.recipe.collector import Collector
from slurmrl.recipe.container import Container
from slurmrl.recipe.eval import Eval
from slurmrl.recipe.fields import NAME_RE, EnvMap, blank_fields
from slurmrl.recipe.inference import Inference
from slurmrl.recipe.judge import Judge
from slurmrl.recipe.log import Log
from slurmrl.recipe.model import Model
from slurmrl.recipe.orchestrator import Orchestrator
from slurmrl.recipe.placement import Placement
from slurmrl.recipe.python import Python
from slurmrl.recipe.schema import OnDemand
from slurmrl.recipe.serving import Disaggregated
from slurmrl.recipe.slurm import Slurm
from slurmrl.recipe.sweep import Sweep
from slurmrl.recipe.trainer import SFT_BATCH_SIZE, Trainer
from slurmrl.recipe.wandb import Wandb
from slurmrl.settings.limits import MAX_JOB_GPUS
from slurmrl.settings.section import PathText, Section


class Recipe(Section):
    name: str = Field(pattern=NAME_RE, description="Run name; also the run dir name.")
    kind: Literal["sft", "rl", "inference"] = Field(description="What the job does.")
    output_dir: PathText = Field("runs", description="Parent folder of run dirs (relative to the current directory).")
    templates_dir: PathText | None = Field(
        None,
        description="Folder of ejected templates (`slurmrl templates eject DIR`) to render with instead "
        "(relative to the recipe file).",
    )
    slurm: Slurm = Field(default_factory=Slurm, description="sbatch directives.")
    container: Annotated[Container | None, OnDemand] = Field(None, description="Pyxis container; omit to run on the host.")
    python: Python = Field(default_factory=Python, description="Python environment on the host.")
    model: Model = Field(description="The model.")
    env: EnvMap = Field(default_factory=dict, description="Environment for every step.")
    log: Log = Field(default_factory=Log, description="Logging level of the job's engines and libraries.")
    placement: Placement = Field(default_factory=Placement, description="Placement choices.")
    trainer: Trainer | None = Field(None, description="Trainer (kinds `sft`, `rl`).")
    orchestrator: Orchestrator | None = Field(None, description="Orchestrator (kind `rl`).")
    inference: Annotated[Inference | None, OnDemand] = Field(None, description="Inference servers (kinds `rl`, `inference`).")
    benchmark: Annotated[Benchmark | None, OnDemand] = Field(
        None, description="Load test of the job's endpoint once it is ready (kind `inference`)."
    )
    sweep: Annotated[Sweep | None, OnDemand] = Field(
        None, description="A grid of values for this recipe's fields; rendered and submitted by `slurmrl sweep`."
    )
    judge: Annotated[Judge | None, OnDemand] = Field(
        None, description="A judge or reward model served by vLLM in the job, for rewards (kind `rl`)."
    )
    eval: Annotated[Eval | None, OnDemand] = Field(
        None, description="Evaluation during training on held-out prompts, every N steps (kind `rl`)."
    )
    wandb: Wandb = Field(
        default_factory=Wandb, description="W&B runs of the trainer and the orchestrator, one group (kinds `sft`, `rl`)."
    )
    collector: Annotated[Collector | None, OnDemand] = Field(
        None, description="Keep every component's Prometheus `/metrics` in the run dir while the job runs "
        "(`slurmrl report` draws them)."
    )

    @model_validator(mode="after")
    def _no_blank(self) -> Recipe:
        """One rule for every section: no blank string and no blank list item reaches a script."""
        for path, problem in blank_fields(self):
            raise UserError(path, problem)  # UserError passes through pydantic: the message names the field
        return self

    @model_validator(mode="after")
    def _size(self) -> Recipe:
        """The whole job's GPUs, before any planning work grows with them."""
        parts = job_gpus(self)
        total = sum(n for _, n in parts)
        if total > MAX_JOB_GPUS:
            field = max(parts, key=lambda p: p[1])[0]
            # UserError passes through pydantic untouched: the message names the field, not the recipe.
            raise UserError(
                field, f"the job would use {total} GPUs; at most {MAX_JOB_GPUS} are supported in one job "
                "(the largest clusters hold about 100k)",
            )
        return self



def job_gpus(r: Recipe) -> list[tuple[str, int]]:
    """(field, GPUs) for each part of the job, as the recipe asks (an upper bound where parts share nodes)."""
    gpn, out = r.slurm.gpus_per_node, []
    if r.trainer is not None:
        t = r.trainer.gpus_per_node
        out.append(("trainer.nodes", r.trainer.nodes * (gpn if t is None else t)))
    inf = r.inference
    if isinstance(inf, Disaggregated) and inf.mode == "pd":  # an engine with P/D roles
        for name, role in inf.roles().items():
            if role is not None:
                out.append((f"inference.{name}.replicas", max(role.replicas * role.tp, (role.nodes or 0) * gpn)))
    elif inf is not None:
        g = inf.gpus_per_node
        out.append(("inference.nodes", inf.nodes * (gpn if g is None else g)))
    if r.judge is not None:
        out.append(("judge.nodes", r.judge.nodes * (r.judge.gpus_per_node or r.judge.tp)))
    return out


def global_batch(r: Recipe) -> int:
    """Sequences per optimizer step, the one place ``trainer.batch_size`` is resolved: kind ``rl``
    samples prompts_per_step x rollouts_per_prompt (a recipe's batch_size must agree, see
    ``slurmrl.plan.rules``); kind ``sft`` takes batch_size, or ``SFT_BATCH_SIZE``."""
    if r.kind == "rl":
        o = r.orchestrator or Orchestrator()
        return o.prompts_per_step * o.rollouts_per_prompt
    assert r.trainer is not None, "kind sft has a [trainer] (slurmrl.plan.rules.check_sections)"
    return r.trainer.batch_size or SFT_BATCH_SIZE
