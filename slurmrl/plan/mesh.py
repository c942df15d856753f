"""The trainer's device mesh (``[trainer.parallel]``) against its processes, its rows and its model:
``dp_replicate x dp_shard x cp`` must be the trainer's processes, ``ep`` must divide ``dp_shard x cp``
and the model's routed experts (a dense model takes none), ``cp`` must divide ``trainer.seq_len``;
``cp_style`` (default: Ulysses where ``cp`` divides the attention heads, else ring): Ulysses needs ``cp``
to divide the heads, ring ``2 cp`` to divide ``trainer.seq_len``. The model's numbers come from its
``config.json`` where plan can read it (``model_kind``), else from the listed shape of a well-known hub
id (``hub_shapes``); any other hub id is judged by its name (MoE or not), its counts are checked by the
trainer (and its ``cp_style``, where none is set, chosen there)."""

from __future__ import annotations

from slurmrl.errors import UserError
from slurmrl.plan import model_kind
from slurmrl.settings.trainer import Parallel

FIELD = "trainer.parallel"


def _count(config: dict, names: tuple[str, ...]) -> int | None:
    for c in [config] + [config[k] for k in model_kind.SUB_CONFIGS if isinstance(config.get(k), dict)]:
        for n in names:
            v = c.get(n)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def _source(model_path: str) -> str:
    """Where the model's numbers came from, for an error."""
    if model_kind.config_of(model_path) is not None:
        return f"{model_path}/config.json"
    return f"the published config.json of {model_path}"


def resolve(p: Parallel, world: int, seq_len: int, model_path: str) -> Parallel:
    """``p`` with ``dp_shard`` filled in; UserError naming the field of the first impossible choice."""
    if world % (p.dp_replicate * p.cp):
        name = "cp" if p.cp > 1 else "dp_replicate"
        raise UserError(f"{FIELD}.{name}", f"dp_replicate {p.dp_replicate} x cp {p.cp} does not divide the "
                        f"trainer's {world} processes (trainer.nodes x GPUs per node)")
    shard = p.dp_shard if p.dp_shard is not None else world // (p.dp_replicate * p.cp)
    if p.dp_replicate * shard * p.cp != world:
        raise UserError(f"{FIELD}.dp_shard", f"dp_replicate {p.dp_replicate} x dp_shard {shard} x cp {p.cp} = "
                        f"{p.dp_replicate * shard * p.cp}, the trainer has {world} processes")
    if (shard * p.cp) % p.ep:
        raise UserError(f"{FIELD}.ep", f"ep {p.ep} does not divide dp_shard {shard} x cp {p.cp} = {shard * p.cp} "
                        "(expert-parallel ranks are taken from the data-sharding and context ranks)")
    if seq_len % p.cp:
        raise UserError(f"{FIELD}.cp", f"cp {p.cp} does not divide trainer.seq_len {seq_len}: each rank takes "
                        "an equal slice of every row")
    config = model_kind.config_or_known(model_path) if p.ep > 1 or p.cp > 1 else None
    if p.ep > 1:
        model_kind.check_moe(model_path, f"{FIELD}.ep", "there are no experts to split over ep ranks")
        experts = _count(config, model_kind.EXPERT_FIELDS) if config is not None else None
        if experts is not None and experts % p.ep:
            raise UserError(f"{FIELD}.ep", f"ep {p.ep} does not divide the model's {experts} routed experts "
                            f"({_source(model_path)})")
    style = p.cp_style
    if p.cp > 1:
        heads = _count(config, ("num_attention_heads",)) if config is not None else None
        style = p.style_for(heads)
        if style == "ulysses" and heads is not None and heads % p.cp:
            raise UserError(f"{FIELD}.cp_style", f"ulysses: cp {p.cp} does not divide the model's {heads} attention "
                            f"heads ({_source(model_path)}; Ulysses splits heads across the cp ranks); "
                            "set cp_style = \"ring\"")
        if style == "ring" and seq_len % (2 * p.cp):
            raise UserError(f"{FIELD}.cp", f"cp {p.cp} with cp_style ring: 2 x cp = {2 * p.cp} does not divide "
                            f"trainer.seq_len {seq_len} (ring attention cuts each row into 2 x cp equal chunks)")
    return p.model_copy(update={"dp_shard": shard, "cp_style": style})


# what the trainer's loop runs today: a mesh dimension left out here is refused at plan, named
RUNS = {"dp_replicate", "dp_shard", "cp", "ep"}


def check_runs(p: Parallel) -> None:
    """One line naming the first dimension the trainer's loop does not run yet (the mesh itself is valid)."""
    for name in ("dp_replicate", "cp", "ep"):
        if getattr(p, name) > 1 and name not in RUNS:
            raise UserError(f"{FIELD}.{name}", f"{name} {getattr(p, name)}: the trainer does not run this "
                            f"dimension yet; set {name} = 1")
    if p.dp_replicate > 1 and p.ep > 1:
        raise UserError(f"{FIELD}.dp_replicate", f"dp_replicate {p.dp_replicate} with ep {p.ep}: the trainer does "
                        "not run HSDP with expert parallelism yet (expert slices are reduced over every rank); set "
                        "dp_replicate = 1 or ep = 1")


def describe(p: dict) -> str:
    """One line for ``slurmrl plan``: the resolved mesh as the trainer's settings carry it."""
    world = p["dp_replicate"] * p["dp_shard"] * p["cp"]
    style = p.get("cp_style") or "ulysses or ring by the model's heads, at start"
    return (f"Trainer mesh: dp_replicate {p['dp_replicate']} x dp_shard {p['dp_shard']} x cp {p['cp']}"
            + (f" ({style})" if p["cp"] > 1 else "") + f" = {world} "
            f"process(es); ep {p['ep']}" + (" (experts split over dp_shard x cp)" if p["ep"] > 1 else ""))
