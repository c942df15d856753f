"""Engine families, one module each, behind one protocol (``base.Engine``).

The planner places and builds them in this order: the policy's servers (vLLM's, or Dynamo's in
their place), then the judge, whose servers follow the policy's ports on shared nodes.
A new family: one module with ``name``, ``check``, ``serves``, ``place``, ``build``, listed here.
"""

from __future__ import annotations

from slurmrl.plan.engines import dynamo, judge, vllm
from slurmrl.plan.engines.base import Engine
from slurmrl.recipe.recipe import Recipe

ENGINES: tuple[Engine, ...] = (vllm, dynamo, judge)


def check(r: Recipe) -> None:
    """Every family's recipe rules, in registration order."""
    for engine in ENGINES:
        engine.check(r)


__all__ = ["ENGINES", "Engine", "check", "dynamo", "judge", "vllm"]
