"""The trainer mesh's validity rules, written once: ``problem`` answers (the recipe field, one sentence)
for the first impossible choice of ``[trainer.parallel]``, or None. ``slurmrl plan`` calls it (exit 2,
the line naming the field; ``plan/mesh.py``) with what it can read of the model; the trainer calls it
at start with its own world size (``runtime/trainer/mesh.py``) and again once the model is loaded,
with the model's own counts. So a rule can neither pass at plan and fail in the job in other words,
nor live on one side only.

The rules: ``dp_replicate x dp_shard x cp`` is the trainer's processes; ``ep`` divides
``dp_shard x cp`` and the model's routed experts (a model with none takes no ``ep``); ``cp`` divides
``trainer.seq_len``; ``cp_style`` (default: Ulysses where ``cp`` divides the attention heads, else
ring): Ulysses needs ``cp`` to divide the heads, ring ``2 cp`` to divide ``trainer.seq_len``. And what
the trainer does not run yet: HSDP (``dp_replicate > 1``) beside ``ep > 1``, and ``ep > 1`` with a LoRA
policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurmrl.settings.trainer import Parallel

FIELD = "trainer.parallel"
# the config.json fields that count a model's routed experts (Qwen-MoE, Mixtral, DeepSeek, ...)
EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
SUB_CONFIGS = ("text_config", "language_config", "llm_config")  # a multimodal model's language model
Problem = tuple[str, str]  # (the recipe field, one sentence)


def count(config: dict, names: tuple[str, ...]) -> int | None:
    """The first positive integer field of ``names`` in ``config`` or its language model's sub-config."""
    for c in [config] + [config[k] for k in SUB_CONFIGS if isinstance(config.get(k), dict)]:
        for n in names:
            v = c.get(n)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


@dataclass(frozen=True)
class ModelShape:
    """What the mesh rules read of the model: routed experts (None: not known, 0: a model without
    experts), attention heads (None: not known), and where those numbers come from, for a sentence."""

    experts: int | None = None
    heads: int | None = None
    source: str = ""

    @classmethod
    def of(cls, config: dict, source: str, moe: bool | None = None) -> ModelShape:
        """From a ``config.json`` dict; ``moe``: whether the model has experts where the count is absent
        (False: it has none; None/True: the count is not known)."""
        experts = count(config, EXPERT_FIELDS)
        return cls(0 if experts is None and moe is False else experts, count(config, ("num_attention_heads",)),
                   source)

    def where(self) -> str:
        return f" ({self.source})" if self.source else ""


def shard_of(p: Parallel, world: int) -> int:
    """``dp_shard`` as set, else the trainer's processes / (dp_replicate x cp)."""
    return p.dp_shard if p.dp_shard is not None else world // (p.dp_replicate * p.cp)


def _sizes(p: Parallel, world: int, seq_len: int) -> Problem | None:
    if world % (p.dp_replicate * p.cp):
        name = "cp" if p.cp > 1 else "dp_replicate"
        return (f"{FIELD}.{name}", f"dp_replicate {p.dp_replicate} x cp {p.cp} does not divide the trainer's "
                f"{world} processes (trainer.nodes x GPUs per node)")
    shard = shard_of(p, world)
    if p.dp_replicate * shard * p.cp != world:
        return (f"{FIELD}.dp_shard", f"dp_replicate {p.dp_replicate} x dp_shard {shard} x cp {p.cp} = "
                f"{p.dp_replicate * shard * p.cp}, the trainer has {world} processes")
    if (shard * p.cp) % p.ep:
        return (f"{FIELD}.ep", f"ep {p.ep} does not divide dp_shard {shard} x cp {p.cp} = {shard * p.cp} "
                "(expert-parallel ranks are taken from the data-sharding and context ranks)")
    if seq_len % p.cp:
        return (f"{FIELD}.cp", f"cp {p.cp} does not divide trainer.seq_len {seq_len}: each rank takes an equal "
                "slice of every row")
    return None


def _model(p: Parallel, seq_len: int, m: ModelShape) -> Problem | None:
    if p.ep > 1 and m.experts == 0:
        return (f"{FIELD}.ep", f"ep {p.ep}: the model is not a mixture-of-experts model{m.where()}: there are no "
                "experts to split over ep ranks")
    if p.ep > 1 and m.experts is not None and m.experts % p.ep:
        return f"{FIELD}.ep", f"ep {p.ep} does not divide the model's {m.experts} routed experts{m.where()}"
    style = p.style_for(m.heads)
    if p.cp > 1 and style == "ulysses" and m.heads is not None and m.heads % p.cp:
        return (f"{FIELD}.cp_style", f"ulysses: cp {p.cp} does not divide the model's {m.heads} attention heads"
                f"{m.where()} (Ulysses splits heads across the cp ranks); set cp_style = \"ring\"")
    if p.cp > 1 and style == "ring" and seq_len % (2 * p.cp):
        return (f"{FIELD}.cp", f"cp {p.cp} with cp_style ring: 2 x cp = {2 * p.cp} does not divide "
                f"trainer.seq_len {seq_len} (ring attention cuts each row into 2 x cp equal chunks)")
    return None


def _runs(p: Parallel, lora: bool) -> Problem | None:
    if p.dp_replicate > 1 and p.ep > 1:
        return (f"{FIELD}.dp_replicate", f"dp_replicate {p.dp_replicate} with ep {p.ep}: the trainer does not run "
                "HSDP with expert parallelism yet (expert slices are reduced over every rank); set dp_replicate = 1 "
                "or ep = 1")
    if p.ep > 1 and lora:
        return (f"{FIELD}.ep", f"ep {p.ep} with a LoRA policy ([trainer.lora]): the trainer does not run expert "
                "parallelism under LoRA yet; set ep = 1 or leave [trainer.lora] out")
    return None


def problem(p: Parallel, world: int, seq_len: int, lora: bool = False,
            model: ModelShape | None = None) -> Problem | None:
    """The first impossible choice of ``p`` for ``world`` processes, rows of ``seq_len`` tokens, a LoRA
    policy or not, and ``model`` (what is known of it): (field, sentence), or None where it runs."""
    return _sizes(p, world, seq_len) or _model(p, seq_len, model or ModelShape()) or _runs(p, lora)
