"""[placement]: colocation and the job's port base."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from slurmrl.settings.section import Section


class Placement(Section):
    colocate: Literal[False, True, "hybrid"] = Field(
        False,
        description="RL on one node: trainer and inference share the node, GPUs split between them. `\"hybrid\"`: "
        "the hybrid engine, vLLM (sleep mode) and the trainer take turns on the same GPUs (needs `share_gpus`, "
        "CUDA GPUs and `orchestrator.max_off_policy_steps = 0`; docs/rl.md).",
    )
    share_gpus: bool = Field(
        False, description="Trainer and inference use the same GPUs (e.g. one GPU); needs `colocate`."
    )
    port_base: Annotated[int, Field(ge=1024, le=65000)] | None = Field(
        None,
        description="Fixed first port instead of one derived from the job id (debugging only; 1024-65000, so the "
        "job's block of ports stays below 65536).",
    )
