"""The one protocol every engine family implements (srt-slurm's ``backends/base.py`` is the model).

An engine family is one package of ``slurmrl.plan.engines`` whose ``__init__`` has these names; the
package holds everything its planning needs: its recipe checks, where its components go and their
command lines. The planner calls nothing else of it, and asks no engine's name. An engine that serves the policy (``inference.backend``) has its section in
``slurmrl.recipe`` (a member of ``slurmrl.recipe.inference.Inference``) and its line in
``slurmrl.plan.engines.BACKENDS``; one beside it (the judge) is listed in ``ENGINES`` only.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from slurmrl.plan.context import Context
from slurmrl.recipe.recipe import Recipe


@runtime_checkable
class Engine(Protocol):
    name: str  # the family, as a person names it: "vllm", "dynamo", "judge"; a policy engine's is its backend
    leftover_check: bool  # its nodes are checked for an earlier job's leftovers first (Dynamo: wide-EP /dev/shm)

    def check(self, r: Recipe) -> None:
        """Every rule of this family the recipe breaks: one UserError naming the field. Runs for
        every registered family, whether it serves the recipe or not (a family beside the policy,
        the judge, refuses settings that need it)."""
        ...

    def resolve(self, r: Recipe) -> Recipe:
        """``r`` with what this family fills in where the recipe leaves it out (vLLM: a LoRA policy's
        ``inference.max_lora_rank``); ``r`` itself when nothing. Runs after every ``check``."""
        ...

    def serves(self, r: Recipe) -> bool:
        """This family runs components of this recipe."""
        ...

    def place(self, ctx: Context) -> None:
        """Het groups and GPU slots of its components (``ctx.group``, ``ctx.slots``)."""
        ...

    def build(self, ctx: Context) -> None:
        """Its components, whole: instances, health, supervisor and command line (``ctx.add``)."""
        ...


def serves_backend(r: Recipe, name: str) -> bool:
    """A policy engine serves the recipe whose ``inference.backend`` names it."""
    return r.inference is not None and r.inference.backend == name
