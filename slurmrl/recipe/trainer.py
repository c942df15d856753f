"""[trainer]: the fields the trainer program reads (``slurmrl.settings.trainer.TrainerKnobs``) and
what the planner places it with."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from slurmrl.contract.weight_sync import WeightSync, from_recipe
from slurmrl.recipe.fields import FAIL_ON_HELP, EnvMap, FailOn
from slurmrl.settings.limits import MAX_GPUS_PER_NODE, MAX_NODES
from slurmrl.settings.trainer import TrainerKnobs

SFT_BATCH_SIZE = 32  # trainer.batch_size of kind sft when the recipe leaves it out; see global_batch()


class Trainer(TrainerKnobs):
    nodes: int = Field(1, ge=1, le=MAX_NODES, description=f"Trainer nodes (1-{MAX_NODES}).")
    gpus_per_node: Annotated[int, Field(ge=0, le=MAX_GPUS_PER_NODE)] | None = Field(
        None,
        description="GPUs per node for the trainer; defaults to all (or what inference leaves when colocated) "
        f"(0-{MAX_GPUS_PER_NODE}).",
    )
    batch_size: Annotated[int, Field(ge=1, le=2**20)] | None = Field(
        None,
        description=f"Sequences per optimizer step (global; 1-{2**20}). Kind `sft`: {SFT_BATCH_SIZE} when left out. "
        "Kind `rl`: always orchestrator.prompts_per_step x rollouts_per_prompt; leave it out or give that number.",
    )
    env: EnvMap = Field(default_factory=dict, description="Extra environment for the trainer step.")
    fail_on: FailOn = Field(default_factory=list, description=FAIL_ON_HELP.format(what="the trainer"))
    weight_sync: Literal["filesystem", "nccl", "ipc", "gloo"] = Field(
        "filesystem",
        description="RL: how new weights reach the servers after each step. `filesystem`: safetensors in the run "
        "dir, which every server reloads. `nccl`: broadcast through vLLM's weight-transfer routes from the "
        "trainer's rank 0 to every server GPU (trainer and servers on different GPUs). `ipc`: the same on a GPU "
        "the trainer shares with the server (`placement.share_gpus`). `gloo`: the same over the network without "
        "GPUs (slurmrl's engine, for CPU nodes and tests). See docs/rl.md.",
    )
    weight_sync_timeout: int = Field(
        600, ge=10, le=86400,
        description="RL, broadcast: seconds one weight sync (or opening the transfer group) may take before the "
        "trainer fails naming the servers that do not answer (10-86400).",
    )

    @property
    def sync(self) -> WeightSync:
        """``weight_sync`` and ``weight_sync_timeout`` as one typed value, decided here once."""
        return from_recipe(self.weight_sync, self.weight_sync_timeout)
