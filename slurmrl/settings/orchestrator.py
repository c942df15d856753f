"""The orchestrator's settings: ``RUN_DIR/components/orchestrator.toml``, read by
``slurmrl.runtime.orchestrator``. Where requests and weight reloads go is not here: the job
script passes those URLs on the command line (``--requests-url``, ``--admin-urls``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from slurmrl.recipe.schema import OrchestratorKnobs, PosInt, Recipe
from slurmrl.settings.judge import JudgeSettings, judge_settings
from slurmrl.settings.read import read


class OrchestratorSettings(OrchestratorKnobs):
    """The recipe's orchestrator fields the program reads (defaults there), plus what the planner derives."""

    run_dir: str = Field(description="The run dir (absolute).")
    model: str = Field(description="Where the tokenizer comes from: recipe model.path (hub id or folder).")
    served_model_name: str = Field(description="The model name the inference servers answer to.")
    trust_remote_code: bool = Field(False, description="Allow tokenizer code from the checkpoint: model.trust_remote_code.")
    max_steps: PosInt = Field(description="Batches to produce: trainer.max_steps.")
    judge: JudgeSettings | None = Field(
        None, description="How rewards are scored through the job's judge ([judge]); None without one."
    )
    hybrid: bool = Field(
        False, description="placement.colocate = 'hybrid': put the servers to sleep before each batch is handed "
        "to the trainer, wake them and reload the new weights before the next (slurmrl.runtime.orchestrator.hybrid).",
    )

    @property
    def root(self) -> Path:
        return Path(self.run_dir)


def orchestrator_settings(recipe: Recipe, run_dir: str) -> OrchestratorSettings:
    """What the planner writes for ``recipe``'s orchestrator (``recipe.orchestrator`` must be set)."""
    return OrchestratorSettings(
        **recipe.orchestrator.model_dump(include=set(OrchestratorKnobs.model_fields)),
        run_dir=run_dir, model=recipe.model.path, served_model_name=recipe.model.served_model_name,
        trust_remote_code=recipe.model.trust_remote_code,
        max_steps=recipe.trainer.max_steps,
        judge=judge_settings(recipe),
        hybrid=recipe.placement.colocate == "hybrid",
    )


def load(path: str | Path) -> OrchestratorSettings:
    return read(OrchestratorSettings, path)
