"""Typed settings of our own programs, shared by the planner and the runtimes.

One frozen pydantic model per role (``trainer.TrainerSettings``, ``orchestrator.OrchestratorSettings``):
the planner builds it from the recipe, render writes ``RUN_DIR/components/<role>.toml`` as its
``model_dump(mode="json")``, and the runtime loads it back with ``load(path)``. Each role's knobs
(``TrainerKnobs``, ``OrchestratorKnobs``, ``JudgeKnobs``) are the base of its recipe section
(``slurmrl.recipe.trainer`` ...), so a default is written in one place; ``slurmrl.recipe.roles``
builds the settings from a recipe.

Below the recipe: pydantic and the leaves only (never slurmrl.recipe, slurmrl.plan, slurmrl.runtime
or torch), so the runtime reads its settings without loading any other section's model.
"""
