"""Typed settings of our own programs, shared by the planner and the runtimes.

One frozen pydantic model per role (``trainer.TrainerSettings``, ``orchestrator.OrchestratorSettings``):
the planner builds it from the recipe, render writes ``RUN_DIR/components/<role>.toml`` as its
``model_dump(mode="json")``, and the runtime loads it back with ``load(path)``. The models extend
the recipe's sections (``slurmrl.recipe.schema``), so a default is written in one place.

A leaf: pydantic, the recipe schema, errors and the run-dir layout only (never slurmrl.plan,
slurmrl.runtime or torch), so both sides import it cheaply.
"""
