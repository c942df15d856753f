"""Engine families, one package each, behind one protocol (``base.Engine``).

``BACKENDS``: the engines that serve the policy, keyed on ``inference.backend`` (each has its
section in ``slurmrl.recipe.inference.Inference``); ``ENGINES``: every family, in the order the
planner places and builds them: the policy's servers, then the judge, whose servers follow the
policy's ports on shared nodes.

A new engine: one package here (its ``__init__``: ``name``, ``leftover_check``, ``check``, ``resolve``,
``serves``, ``place``, ``build``; its other modules what its planning needs), its section in
``slurmrl.recipe`` with one line in ``Inference``, and one line below. Nothing else names it or its
section (``tests/test_engine_packages.py``); a section with prefill/decode roles is a
``slurmrl.recipe.serving.Disaggregated``, one vllm-router fronts a ``slurmrl.recipe.router.Routed``.
"""

from __future__ import annotations

from slurmrl.plan.engines import dynamo, judge, sglang, vllm
from slurmrl.plan.engines.base import Engine
from slurmrl.recipe.recipe import Recipe

BACKENDS: dict[str, Engine] = {e.name: e for e in (vllm, dynamo, sglang)}  # inference.backend -> its engine
ENGINES: tuple[Engine, ...] = (*BACKENDS.values(), judge)


def check(r: Recipe) -> None:
    """Every family's recipe rules, in registration order."""
    for engine in ENGINES:
        engine.check(r)


def resolve(r: Recipe) -> Recipe:
    """The recipe with what each family fills in (``Engine.resolve``), in registration order."""
    for engine in ENGINES:
        r = engine.resolve(r)
    return r


def leftover_check(r: Recipe) -> bool:
    """The job checks its nodes for an earlier job's leftovers first: an engine it runs asks for it."""
    return any(e.leftover_check and e.serves(r) for e in ENGINES)


__all__ = ["BACKENDS", "ENGINES", "Engine", "check", "dynamo", "judge", "leftover_check", "resolve", "sglang", "vllm"]
