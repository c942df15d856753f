"""Rules of [eval] and [wandb] that need more than their own section: the environment an evaluation
names, and which kinds run what they configure."""

from __future__ import annotations

from slurmrl.errors import UserError
from slurmrl.plan.env_rules import check_environment
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.user_set import user_set


def check(r: Recipe) -> None:
    if user_set(r, "wandb") and r.kind == "inference":
        raise UserError("wandb", "kind 'inference' runs no trainer or orchestrator, so nothing logs to W&B; remove "
                        "the [wandb] section")
    e = r.eval
    if e is None or r.orchestrator is None:  # [eval] outside kind rl: slurmrl.plan.rules.check_sections
        return
    if e.environment is not None:
        check_environment("eval", e.environment, e.environment_args)
    if r.trainer is not None and e.every > r.trainer.max_steps:
        raise UserError("eval.every", f"is {e.every}, more than trainer.max_steps ({r.trainer.max_steps}): no "
                        "evaluation would run during training")
