"""The trainer's device mesh (``[trainer.parallel]``) at plan: the rules themselves live once, in
``settings/mesh.py`` (the trainer runs the same ones at start and at load); here plan gathers what it
can read of the model for them and resolves ``dp_shard`` and ``cp_style``. The model's numbers come
from its ``config.json`` where plan can read it (``model_kind``), else from the listed shape of a
well-known hub id (``hub_shapes``); for any other hub id plan cannot know its experts or heads: ``ep``
is taken with one warning line (``unknown_experts``; the trainer checks the expert count when it
loads the model) and ``cp_style``, where none is set, is chosen by the trainer at start."""

from __future__ import annotations

from slurmrl.errors import UserError
from slurmrl.plan import hub_shapes, model_kind
from slurmrl.settings.mesh import FIELD, ModelShape, problem, shard_of
from slurmrl.settings.trainer import Parallel


def shape(model_path: str) -> ModelShape:
    """What plan can read of the model at ``model_path``: its config.json here, else a listed hub shape."""
    config = model_kind.config_of(model_path)
    if config is not None:
        return ModelShape.of(config, f"{model_path}/config.json", model_kind.experts_in(config))
    known = hub_shapes.known(model_path)
    if known is not None:
        return ModelShape.of(known, f"the published config.json of {model_path}", True)
    return ModelShape()


def resolve(p: Parallel, world: int, seq_len: int, model_path: str, lora: bool = False) -> Parallel:
    """``p`` with ``dp_shard`` (and ``cp_style`` where the heads are known) filled in; UserError naming the
    field of the first impossible choice (``settings.mesh.problem``)."""
    model = shape(model_path) if p.ep > 1 or p.cp > 1 else ModelShape()
    why = problem(p, world, seq_len, lora, model)
    if why is not None:
        raise UserError(*why)
    style = p.style_for(model.heads) if p.cp > 1 else p.cp_style
    return p.model_copy(update={"dp_shard": shard_of(p, world), "cp_style": style})


def unknown_experts(p: Parallel, model_path: str) -> str | None:
    """The warning line for ``ep`` over a model whose expert count plan cannot read, else None."""
    if p.ep == 1 or shape(model_path).experts is not None:
        return None
    return (f"{FIELD}.ep = {p.ep}: the routed experts of {model_path!r} are not known here (no config.json on "
            "this machine, not a listed hub shape): the trainer checks that it has experts and that ep divides "
            "them when it loads the model")

