"""What a recipe means for each of our programs: the typed settings (``slurmrl.settings``) the planner
writes to ``RUN_DIR/components/<role>.toml`` for the trainer, the orchestrator and its judge client."""

from __future__ import annotations

from pathlib import PurePath

from slurmrl.envs.protocol import CHAT_ONLY
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.user_set import user_set
from slurmrl.settings.eval import EvalKnobs, EvalSettings
from slurmrl.settings.judge import JUDGE_TEMPLATES, JudgeKnobs, JudgeSettings
from slurmrl.settings.orchestrator import OrchestratorKnobs, OrchestratorSettings
from slurmrl.settings.trainer import TrainerKnobs, TrainerSettings
from slurmrl.settings.wandb import WandbSettings, safe_name


def trainer_settings(recipe: Recipe, run_dir: str, world_size: int, global_batch: int) -> TrainerSettings:
    """What the planner writes for ``recipe``'s trainer (``recipe.trainer`` must be set)."""
    assert recipe.trainer is not None, "the planner asks for it only when the recipe has a [trainer]"
    return TrainerSettings(
        **recipe.trainer.model_dump(include=set(TrainerKnobs.model_fields)),
        run_dir=run_dir, kind=recipe.kind, model=recipe.model.path, trust_remote_code=recipe.model.trust_remote_code,
        world_size=world_size, global_batch=global_batch, hybrid=recipe.placement.colocate == "hybrid",
        weight_sync=recipe.trainer.sync, wandb=wandb_settings(recipe, run_dir),
        grace_seconds=recipe.slurm.grace_seconds,
    )


def orchestrator_settings(recipe: Recipe, run_dir: str) -> OrchestratorSettings:
    """What the planner writes for ``recipe``'s orchestrator (``recipe.orchestrator`` must be set)."""
    assert recipe.orchestrator is not None and recipe.trainer is not None, "kind rl has both (check_sections)"
    return OrchestratorSettings(
        **recipe.orchestrator.model_dump(include=set(OrchestratorKnobs.model_fields)),
        run_dir=run_dir, model=recipe.model.path, served_model_name=recipe.model.served_model_name,
        trust_remote_code=recipe.model.trust_remote_code,
        max_steps=recipe.trainer.max_steps,
        judge=judge_settings(recipe), weight_sync=recipe.trainer.sync,
        hybrid=recipe.placement.colocate == "hybrid",
        lora=recipe.trainer.lora is not None,
        **serving_limits(recipe),
        eval=eval_settings(recipe),
        wandb=wandb_settings(recipe, run_dir),
        chat_only_set=chat_only_set(recipe, changed=True),
    )


def serving_limits(recipe: Recipe) -> dict:
    """How many servers the orchestrator needs live (inference.min_servers) and for how long it waits for a
    dead one to come back (inference.startup_timeout); the defaults without an [inference] section."""
    inf = recipe.inference
    return {} if inf is None else {"min_servers": inf.min_servers, "servers_grace_s": float(inf.startup_timeout)}


def chat_only_set(recipe: Recipe, changed: bool = False) -> list[str]:
    """The chat-only fields (``slurmrl.envs.protocol.CHAT_ONLY``) the user set in ``recipe``, whatever their
    value; ``changed``: only those set to another value than their default (what a resolved recipe, the run
    dir's recipe.toml, still tells as set: a re-render of it writes the same settings)."""
    out = []
    for path in CHAT_ONLY:
        section, name = path.split(".")
        where = getattr(recipe, section)
        if where is None or not user_set(where, name):
            continue
        if not changed or getattr(where, name) != type(where).model_fields[name].get_default(call_default_factory=True):
            out.append(path)
    return out


def judge_settings(recipe: Recipe) -> JudgeSettings | None:
    """What the planner writes for ``recipe``'s judge (None without a [judge] section)."""
    j = recipe.judge
    if j is None:
        return None
    knobs = j.model_dump(include=set(JudgeKnobs.model_fields))
    knobs["template"] = j.template or JUDGE_TEMPLATES[j.kind]
    return JudgeSettings(**knobs, served_model_name=j.model.served_model_name, wait_s=float(j.startup_timeout))


def eval_settings(recipe: Recipe) -> EvalSettings | None:
    """What the planner writes for ``recipe``'s [eval] (None without one): the held-out split of the
    training environment unless eval.environment names another, max_tokens from the orchestrator's."""
    e, o = recipe.eval, recipe.orchestrator
    if e is None:
        return None
    assert o is not None, "[eval] is kind rl's, which has an orchestrator (slurmrl.plan.eval_rules)"
    knobs = e.model_dump(include=set(EvalKnobs.model_fields))
    heldout = e.environment is None
    knobs.update(environment=o.environment if heldout else e.environment,
                 environment_args=o.environment_args if heldout else e.environment_args,
                 max_tokens=e.max_tokens or o.max_tokens, heldout=heldout)
    return EvalSettings(**knobs)


def wandb_settings(recipe: Recipe, run_dir: str) -> WandbSettings:
    """[wandb] with the group and the name resolved: the run dir's name, so the trainer's and the
    orchestrator's runs share one group."""
    w, name = recipe.wandb, safe_name(PurePath(run_dir).name)
    return WandbSettings(**{**w.model_dump(), "group": w.group or name, "name": w.name or name})
