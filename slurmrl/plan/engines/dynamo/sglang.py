"""Dynamo's SGLang workers (``[inference.dynamo] engine = "sglang"``): ``python -m dynamo.sglang``
with SGLang's own flags, the shape srt-slurm's SGLang backend starts behind Dynamo's frontend.

A worker is ``tp x dp`` GPUs, or ``tp`` with data-parallel attention (``attention_dp``: dp ranks
over the tp GPUs, dp divides tp). One process per node of a worker (SGLang starts a scheduler per
GPU itself); one larger than a node spans ``tp / GPUs-per-node`` nodes through ``--nnodes``,
``--node-rank`` and ``--dist-init-addr`` (``slurmrl.plan.engines.sglang.launch``), and only its first node registers
with Dynamo (Dynamo 1.4.2's ``init_llm``: a node of rank >= 1 runs the engine and no endpoint),
so the frontend lists one instance per worker. Disaggregation: ``--disaggregation-mode``, the
recipe's transfer backend, and a prefill worker's bootstrap server on its ``kv_<k>`` port (else
Dynamo takes a random free port on each start).
"""

from __future__ import annotations

from slurmrl.errors import UserError
from slurmrl.plan import shell
from slurmrl.plan.context import Context
from slurmrl.plan.engines.dynamo.dp import Role
from slurmrl.plan.engines.sglang import launch
from slurmrl.plan.model import Arg
from slurmrl.plan.parallel import Parallelism
from slurmrl.plan.spec import Slot
from slurmrl.recipe.dynamo import DynamoInference
from slurmrl.recipe.recipe import Recipe

MODULE = "dynamo.sglang"
OWN = ("transfer_backend", "mem_fraction_static")  # [inference.dynamo] fields only engine "sglang" reads


def check(r: Recipe, inf: DynamoInference) -> None:
    """Engine ``sglang``'s fields: read by it alone, the transfer backend in mode ``pd`` only."""
    d = inf.dynamo
    if d.engine != "sglang":
        for field in OWN:
            if getattr(d, field) is not None:
                raise UserError(f"inference.dynamo.{field}", "only engine 'sglang' reads it")
        return
    if inf.mode == "pd" and d.transfer_backend is None:
        raise UserError("inference.dynamo.transfer_backend", "SGLang's P/D moves KV with a transfer backend that "
                        f"needs the nodes' GPUs and NICs: name one ({' or '.join(launch.TRANSFER_BACKENDS)})")
    if inf.mode != "pd" and d.transfer_backend is not None:
        raise UserError("inference.dynamo.transfer_backend", "only mode 'pd' moves KV between workers")
    sizes = [inf.dp] if inf.mode != "pd" else [spec.dp for spec in (inf.prefill, inf.decode) if spec is not None]
    if d.attention_dp and max(sizes) == 1:
        raise UserError("inference.dynamo.attention_dp", "engine 'sglang' runs dp attention ranks over a worker's tp "
                        "GPUs: set dp > 1 (dp divides tp)")


def attention(inf: DynamoInference, dp: int) -> bool:
    """Data-parallel attention for workers of ``dp`` ranks (``attention_dp`` applies to the roles with dp > 1)."""
    return inf.dynamo.attention_dp and dp > 1


def parallelism(inf: DynamoInference, field: str, tp: int, dp: int) -> Parallelism:
    return launch.parallelism(field, tp, dp, attention(inf, dp))


def span(p: Parallelism, gpn: int) -> tuple[int, int]:
    """(nodes per worker, its GPUs per node)."""
    return launch.span(p, gpn)


def check_shape(r: Recipe, inf: DynamoInference, p: Parallelism, dp: int, span: int, per: int) -> None:
    """Refusals for ``per`` workers of ``dp`` ranks per node, of ``span`` nodes each."""
    launch.local(p, per, attention(inf, dp), "inference.dynamo.attention_dp")
    if span > 1 and r.model.stage != "shared":
        raise UserError("model.stage", "a node-local copy for a worker spanning nodes is not built; use \"shared\"")


def _multi(ctx: Context, role: Role, slot: Slot) -> tuple[list[str], list[str], list[Arg]]:
    inf = ctx.r.inference
    assert isinstance(inf, DynamoInference), "planned for Dynamo's workers only"
    return launch.multi_node(slot, role.slice, attention(inf, role.dp), None)


def prelude(ctx: Context, role: Role, slot: Slot) -> list[str]:
    """A worker spanning nodes: its first node and this node's rank."""
    lines, names, _ = _multi(ctx, role, slot)
    return [*shell.declare(*names), *lines] if lines else []


def args(ctx: Context, role: Role, slot: Slot, first_index: int) -> list[Arg]:
    """``dynamo.sglang``'s arguments before ``--disaggregation-mode`` (``dynamo.engine_args`` gives it to
    every engine), the planes and the recipe's extra arguments."""
    inf = ctx.r.inference
    assert isinstance(inf, DynamoInference), "planned for Dynamo's workers only"
    d, m = inf.dynamo, ctx.r.model
    return ["--model-path", ctx.model_path(), "--served-model-name", m.served_model_name,
            *launch.engine_args(ctx, role.tp, role.dp, attention(inf, role.dp), d.mem_fraction_static),
            *_multi(ctx, role, slot)[2], *launch.disaggregation(role.mode, d.transfer_backend, first_index, mode_flag=False)]


def untried(ctx: Context) -> None:
    inf = ctx.r.inference
    assert isinstance(inf, DynamoInference), "planned for Dynamo's workers only"
    launch.untried(ctx, inf.dynamo.transfer_backend)


def ports(inf: DynamoInference, role: Role, node: int, local: int, first_index: int) -> dict[str, str]:
    """The ports a worker's first node listens on besides Dynamo's system port."""
    if not role.slice.leads(node):
        return {}
    return {**launch.dist_ports(role.slice, attention(inf, role.dp)),
            **launch.bootstrap_ports(role.mode, role.slice, node, first_index + local)}
