"""What every engine's ``[inference]`` section reads (``slurmrl.recipe.inference`` holds the union of
them, keyed on ``backend``): its nodes and GPUs, who may call it, its environment, its failure probes,
how long it may take to start; the fields of one prefill/decode role every engine sizes by; and the
type of a section with those roles (``Disaggregated``), which the shared rules ask instead of a field name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

from slurmrl.recipe import restart as policy_fields
from slurmrl.recipe.fields import FAIL_ON_HELP, EnvMap, FailOn
from slurmrl.recipe.restart import RestartMode
from slurmrl.settings.limits import MAX_GPUS_PER_NODE, MAX_JOB_GPUS, MAX_NODES
from slurmrl.settings.section import Section


class Serving(Section):
    """The fields every engine's section has; each engine's section adds its own (and ``backend``)."""

    backend: str = Field(description="The engine.")  # each engine's section narrows it to its own name
    nodes: int = Field(1, ge=1, le=MAX_NODES, description=f"Inference nodes (modes but `pd`, which sizes each role; 1-{MAX_NODES}).")
    gpus_per_node: Annotated[int, Field(ge=0, le=MAX_GPUS_PER_NODE)] | None = Field(
        None,
        description=f"GPUs per node for inference; defaults to all (required when colocated; 0-{MAX_GPUS_PER_NODE}).",
    )
    auth: Literal["job_secret", "none"] = Field(
        "job_secret",
        description="`job_secret`: every request to the servers (and through the router) needs `Authorization: "
        "Bearer` with the run dir's `secret`, admin endpoints included (`/health` and `/metrics` stay open); "
        "`none`: anyone who reaches the ports may call them.",
    )
    env: EnvMap = Field(default_factory=dict, description="Extra environment for the inference steps.")
    fail_on: FailOn = Field(default_factory=list, description=FAIL_ON_HELP.format(what="every inference server"))
    min_servers: int = Field(
        1, ge=1, le=MAX_JOB_GPUS, description="The RL orchestrator goes on while at least this many inference servers are "
        "live: a dead one is routed around and its rollouts re-sent; fewer for longer than `startup_timeout` (the "
        f"time a restarted server may take) fails the job, naming the dead servers (1-{MAX_JOB_GPUS}).",
    )
    startup_timeout: int = Field(
        1800, ge=1, le=86400, description="Seconds to wait for servers to answer /health (1-86400, one day)."
    )
    restart: RestartMode = policy_fields.mode("an inference server")
    max_restarts: int = policy_fields.max_restarts("an inference server")
    restart_backoff_s: int = policy_fields.backoff()


class Role(Section):
    """One side of prefill/decode disaggregation, as every engine sizes it."""

    replicas: int = Field(
        1, ge=1, le=MAX_JOB_GPUS, description=f"Workers of this role (1-{MAX_JOB_GPUS})."
    )
    tp: int = Field(
        1, ge=1, le=MAX_GPUS_PER_NODE,
        description=f"Tensor-parallel size per engine, within one node (1-{MAX_GPUS_PER_NODE}).",
    )
    expert_parallel: bool = Field(False, description="`--enable-expert-parallel` for this role's workers.")
    nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] | None = Field(
        None, description=f"Nodes for this role; default: as few as fit the replicas (1-{MAX_NODES})."
    )
    extra_args: list[str] = Field(default_factory=list, description="Extra arguments for this role's workers.")
    env: EnvMap = Field(default_factory=dict, description="Extra environment for this role.")



class Disaggregated(Serving):
    """An engine's section whose mode ``pd`` splits its servers into prefill and decode roles, each
    sized by a ``Role``. Rules every such engine shares (``slurmrl.plan.rules.check_roles``) ask this
    type. It adds no field: each engine's section declares ``mode``, ``prefill`` and ``decode`` in its
    own order, with its own ``Role``."""

    if TYPE_CHECKING:  # declared by each engine's section (a field here would reorder theirs)
        mode: str
        prefill: Role | None
        decode: Role | None

    def roles(self) -> dict[str, Role | None]:
        """Each role by name, in the order the planner places them."""
        return {"prefill": self.prefill, "decode": self.decode}

class VllmFlags(Section):
    """vLLM engine flags that vLLM's own servers and Dynamo's ``dynamo.vllm`` workers both read."""

    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1,
        description="Fraction of GPU memory for vLLM (set for you when sharing a GPU; above 0, at most 1).",
    )
    enforce_eager: bool = Field(False, description="Disable CUDA graphs / torch.compile.")
