"""[wandb]: where the job's W&B runs go (``slurmrl.settings.wandb.WandbSettings``, read by both runtimes).
The API key is never part of a recipe: W&B reads WANDB_API_KEY from the job's environment."""

from __future__ import annotations

from slurmrl.settings.wandb import WandbSettings


class Wandb(WandbSettings):
    """The trainer's and the orchestrator's W&B runs: project, entity, group (default: the run dir's
    name), name, tags, mode. docs/rl.md: "Run tracking (W&B)"."""
