"""The trainer's settings: ``RUN_DIR/components/trainer.toml``, read by ``slurmrl.runtime.trainer``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from slurmrl.recipe.schema import PosInt, Recipe, TrainerKnobs
from slurmrl.settings.read import read


class TrainerSettings(TrainerKnobs):
    """The recipe's trainer fields the program reads (defaults there), plus what the planner derives."""

    run_dir: str = Field(description="The run dir (absolute).")
    kind: Literal["sft", "rl"] = Field(description="SFT from trainer.dataset, or RL from the orchestrator's batches.")
    model: str = Field(description="The model to start from: recipe model.path (hub id or folder).")
    trust_remote_code: bool = Field(False, description="Allow model code from the checkpoint: model.trust_remote_code.")
    world_size: PosInt = Field(description="Trainer processes the plan starts (nodes x GPUs per node).")
    global_batch: PosInt = Field(
        description="Sequences per optimizer step (SFT: trainer.batch_size; RL: prompts x rollouts per step)."
    )
    hybrid: bool = Field(
        False, description="placement.colocate = 'hybrid': return cached GPU memory after each step, before "
        "publishing, so the sleeping vLLM servers can wake into it.",
    )

    @property
    def root(self) -> Path:
        return Path(self.run_dir)


def trainer_settings(recipe: Recipe, run_dir: str, world_size: int, global_batch: int) -> TrainerSettings:
    """What the planner writes for ``recipe``'s trainer (``recipe.trainer`` must be set)."""
    return TrainerSettings(
        **recipe.trainer.model_dump(include=set(TrainerKnobs.model_fields)),
        run_dir=run_dir, kind=recipe.kind, model=recipe.model.path, trust_remote_code=recipe.model.trust_remote_code,
        world_size=world_size, global_batch=global_batch, hybrid=recipe.placement.colocate == "hybrid",
    )


def load(path: str | Path) -> TrainerSettings:
    return read(TrainerSettings, path)
