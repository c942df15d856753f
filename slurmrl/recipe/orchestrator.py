"""[orchestrator]: the fields the orchestrator program reads
(``slurmrl.settings.orchestrator.OrchestratorKnobs``) and where it runs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from slurmrl.recipe.fields import FAIL_ON_HELP, EnvMap, FailOn
from slurmrl.settings.limits import MAX_CPUS
from slurmrl.settings.orchestrator import OrchestratorKnobs


class Orchestrator(OrchestratorKnobs):
    placement: Literal["trainer", "inference", "own"] = Field(
        "trainer",
        description="Where the one orchestrator runs: the trainer's head node, the first inference node, "
        "or its own CPU-only het group.",
    )
    cpus: int = Field(2, ge=1, le=MAX_CPUS, description=f"CPUs for the orchestrator (1-{MAX_CPUS}).")
    env: EnvMap = Field(default_factory=dict, description="Extra environment for the orchestrator step.")
    fail_on: FailOn = Field(default_factory=list, description=FAIL_ON_HELP.format(what="the orchestrator"))
