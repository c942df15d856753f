"""[inference]: one section per engine, chosen by ``backend`` (``"vllm"`` when it is left out).

Each engine's section holds the keys that engine reads and no other, so a key of another engine is
the loader's ordinary unknown-key error, naming the engine that reads it (``slurmrl.recipe.load``).
A new engine: its section in a module of its own (a ``Serving`` with ``backend: Literal["name"]``; a
``Disaggregated`` with prefill/decode roles, a ``Routed`` where vllm-router fronts it), one line in
``Inference`` below, and its planner package (``slurmrl.plan.engines.<name>``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Discriminator, Tag

from slurmrl.recipe.dynamo import DynamoInference
from slurmrl.recipe.schema import KeyedOn, variants
from slurmrl.recipe.serving import Serving
from slurmrl.recipe.sglang import SglangInference
from slurmrl.recipe.vllm import VllmInference

BACKEND = KeyedOn("backend", default="vllm")  # the field that picks the section, and its default

Inference = Annotated[
    Annotated[VllmInference, Tag("vllm")]
    | Annotated[DynamoInference, Tag("dynamo")]
    | Annotated[SglangInference, Tag("sglang")],
    Discriminator(BACKEND),
]

BACKENDS: dict[str, type[Serving]] = variants(Inference)  # backend -> its section, from the union above

__all__ = ["BACKEND", "BACKENDS", "DynamoInference", "Inference", "Serving", "SglangInference", "VllmInference"]
