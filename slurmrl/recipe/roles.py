"""What a recipe means for each of our programs: the typed settings (``slurmrl.settings``) the planner
writes to ``RUN_DIR/components/<role>.toml`` for the trainer, the orchestrator and its judge client."""

from __future__ import annotations

from slurmrl.recipe.recipe import Recipe
from slurmrl.settings.judge import JUDGE_TEMPLATES, JudgeKnobs, JudgeSettings
from slurmrl.settings.orchestrator import OrchestratorKnobs, OrchestratorSettings
from slurmrl.settings.trainer import TrainerKnobs, TrainerSettings


def trainer_settings(recipe: Recipe, run_dir: str, world_size: int, global_batch: int) -> TrainerSettings:
    """What the planner writes for ``recipe``'s trainer (``recipe.trainer`` must be set)."""
    assert recipe.trainer is not None, "the planner asks for it only when the recipe has a [trainer]"
    return TrainerSettings(
        **recipe.trainer.model_dump(include=set(TrainerKnobs.model_fields)),
        run_dir=run_dir, kind=recipe.kind, model=recipe.model.path, trust_remote_code=recipe.model.trust_remote_code,
        world_size=world_size, global_batch=global_batch, hybrid=recipe.placement.colocate == "hybrid",
    )


def orchestrator_settings(recipe: Recipe, run_dir: str) -> OrchestratorSettings:
    """What the planner writes for ``recipe``'s orchestrator (``recipe.orchestrator`` must be set)."""
    assert recipe.orchestrator is not None and recipe.trainer is not None, "kind rl has both (check_sections)"
    return OrchestratorSettings(
        **recipe.orchestrator.model_dump(include=set(OrchestratorKnobs.model_fields)),
        run_dir=run_dir, model=recipe.model.path, served_model_name=recipe.model.served_model_name,
        trust_remote_code=recipe.model.trust_remote_code,
        max_steps=recipe.trainer.max_steps,
        judge=judge_settings(recipe), weight_sync=recipe.trainer.weight_sync,
        hybrid=recipe.placement.colocate == "hybrid",
    )


def judge_settings(recipe: Recipe) -> JudgeSettings | None:
    """What the planner writes for ``recipe``'s judge (None without a [judge] section)."""
    j = recipe.judge
    if j is None:
        return None
    knobs = j.model_dump(include=set(JudgeKnobs.model_fields))
    knobs["template"] = j.template or JUDGE_TEMPLATES[j.kind]
    return JudgeSettings(**knobs, served_model_name=j.model.served_model_name)
