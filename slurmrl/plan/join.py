"""The joiner shape: the recipe of a job whose servers join a running RL job (`slurmrl submit RECIPE --join RUN_DIR`).

A joiner job is the recipe's ``[inference]`` servers alone (kind ``inference``: no trainer, orchestrator, router,
judge, benchmark or collector), on the recipe's own ``[slurm]`` (any partition: a preemptible one, with
``requeue = false``), named ``<main>-join``, with vLLM's admin endpoints (the weight reload) as an RL job's. The planner's ``join`` puts the main run dir in its environment
(``SLURMRL_JOIN_RUN_DIR``): each server, once ready, registers there (``slurmrl.rundir.joined``) and the main job's orchestrator admits it
with the current weights. Pure: the checks that read the main run dir are ``slurmrl.app.join``'s.
"""

from __future__ import annotations

from typing import Any

from slurmrl.errors import UserError
from slurmrl.recipe.load import validate
from slurmrl.recipe.recipe import Recipe

DROPPED = ("trainer", "orchestrator", "benchmark", "judge", "eval", "collector", "sweep", "wandb")  # they do not serve
SERVING_ONLY = ("router", "min_servers")  # the main job's router and quorum are the main job's


def joiner(recipe: Recipe, main_name: str) -> Recipe:
    """``recipe`` as a joiner job of the job named ``main_name``."""
    inf = recipe.inference
    if inf is None:
        raise UserError("inference", "a joiner job runs inference servers: the recipe needs [inference]")
    if inf.backend != "vllm" or getattr(inf, "mode", "replicas") != "replicas":
        raise UserError("inference.backend", "servers that join are vLLM replicas (backend = \"vllm\", mode = "
                                             "\"replicas\"): the orchestrator loads each one's weights")
    data: dict[str, Any] = recipe.model_dump(mode="json", exclude_unset=True)
    for key in DROPPED:
        data.pop(key, None)
    for key in SERVING_ONLY:
        data["inference"].pop(key, None)
    data["inference"]["admin_endpoints"] = True  # the orchestrator loads each step's weights through them
    data.setdefault("placement", {}).pop("colocate", None)
    data["placement"].pop("share_gpus", None)
    data["kind"], data["name"] = "inference", f"{main_name}-join"
    return validate(data)
