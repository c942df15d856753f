"""[judge]: a judge or reward model served inside the job; the scoring fields the orchestrator's
client reads are ``slurmrl.settings.judge.JudgeKnobs``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from slurmrl.recipe import restart as policy_fields
from slurmrl.recipe.fields import FAIL_ON_HELP, EnvMap, FailOn
from slurmrl.recipe.model import Model
from slurmrl.recipe.restart import RestartMode
from slurmrl.settings.judge import JudgeKnobs
from slurmrl.settings.limits import MAX_GPUS_PER_NODE, MAX_NODES


class Judge(JudgeKnobs):
    """A judge or reward model served by vLLM inside the job; the orchestrator scores rollouts through it
    (environment `judge`, or a custom one with `use_judge`). docs/rl.md: "Reward from a served judge"."""

    model: Model = Field(description="The judge's model (`[judge.model]`: path, served_name, dtype, max_model_len, ...).")
    placement: Literal["own", "inference"] = Field(
        "own",
        description="`own`: its own het group of `nodes` nodes; `inference`: on the first `nodes` inference nodes "
        "(colocated RL: the one node), on GPUs after the ones inference and the trainer take.",
    )
    nodes: int = Field(1, ge=1, le=MAX_NODES, description=f"Nodes with judge servers (1-{MAX_NODES}).")
    gpus_per_node: Annotated[int, Field(ge=1, le=MAX_GPUS_PER_NODE)] | None = Field(
        None,
        description=f"GPUs per node for the judge, `tp` each server; default `tp` (one server per node; "
        f"1-{MAX_GPUS_PER_NODE}).",
    )
    tp: int = Field(1, ge=1, le=MAX_GPUS_PER_NODE, description=f"Tensor-parallel size of each judge server (1-{MAX_GPUS_PER_NODE}).")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Fraction of GPU memory for the judge's vLLM (above 0, at most 1)."
    )
    enforce_eager: bool = Field(False, description="Disable CUDA graphs / torch.compile in the judge's vLLM.")
    extra_args: list[str] = Field(default_factory=list, description="Extra arguments for the judge's vLLM server.")
    env: EnvMap = Field(default_factory=dict, description="Extra environment for the judge's step.")
    critical: bool = Field(
        True, description="`false`: when the judge's servers exit, the job logs it (a phase) and goes on; the "
        "orchestrator's requests to it fail as they would. `true`: its exit fails the job.",
    )
    fail_on: FailOn = Field(default_factory=list, description=FAIL_ON_HELP.format(what="the judge"))
    startup_timeout: int = Field(
        1800, ge=1, le=86400, description="Seconds to wait for the judge to answer /health (1-86400, one day)."
    )
    restart: RestartMode = policy_fields.mode("the judge")
    max_restarts: int = policy_fields.max_restarts("the judge")
    restart_backoff_s: int = policy_fields.backoff()
