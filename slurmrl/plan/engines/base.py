"""The one protocol every engine family implements (srt-slurm's ``backends/base.py`` is the model).

An engine family is one module of ``slurmrl.plan.engines`` with these four names; it owns its
recipe checks, where its components go and their command lines. A new family (SGLang next) is
one new module, listed once in ``slurmrl.plan.engines.ENGINES``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from slurmrl.plan.context import Context
from slurmrl.recipe.recipe import Recipe


@runtime_checkable
class Engine(Protocol):
    name: str  # the family, as a person names it: "vllm", "dynamo", "judge"

    def check(self, r: Recipe) -> None:
        """Every rule of this family the recipe breaks: one UserError naming the field. Runs for
        every registered family, whether it serves the recipe or not (a knob of a family that is
        not used is refused)."""
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
