"""A Dynamo worker role's shape on its nodes, and its data-parallel ranks.

A worker is ``dp`` data-parallel ranks of ``tp`` GPUs each. ``dynamo.vllm`` runs one process per
rank, as Dynamo's own DP launch scripts do (``--data-parallel-size/-rank/-address/-rpc-port``,
each rank registers as its own Dynamo instance and the frontend routes to each); a worker larger
than a node spans tp x dp / GPUs-per-node nodes, its first node's rank 0 serving the DP RPC port
(``dprpc_k`` of the port table). ``dynamo.mocker`` simulates the ranks in one process
(``--data-parallel-size``), on one node. ``dynamo.trtllm`` has no DP size: its attention DP runs
over a worker's tp MPI ranks (``--enable-attention-dp``).
"""

from __future__ import annotations

from dataclasses import dataclass

from slurmrl import ports
from slurmrl.errors import UserError
from slurmrl.plan import shell
from slurmrl.plan.model import Arg, Sh
from slurmrl.plan.parallel import Parallelism, Slice
from slurmrl.plan.spec import Slot
from slurmrl.recipe.dynamo import DynamoInference


@dataclass(frozen=True)
class Role:
    """One family of workers: aggregated (``inference``), or one side of prefill/decode."""

    name: str
    mode: str | None  # --disaggregation-mode: None (aggregated), "prefill", "decode"
    field: str  # where its sizes live in the recipe
    replicas: int  # workers (a worker of dp > 1 is one data-parallel deployment)
    tp: int  # GPUs per engine (tensor-parallel size)
    dp: int  # data-parallel ranks per worker
    span: int  # nodes per worker
    per_node: int  # tasks per node: workers, a worker's ranks (vllm with dp > 1), 1 (trtllm spanning nodes)
    task_gpus: int  # GPUs per task
    nodes: int
    gpus_per_node: int  # GPUs the role uses on each of its nodes
    extra_args: tuple[str, ...]
    env: dict
    engine_config: str | None
    expert_parallel: bool
    rank_tasks: bool  # one task per data-parallel rank (dynamo.vllm with dp > 1), each its own Dynamo instance

    @property
    def slice(self) -> Slice:
        return Slice(self.span, self.per_node, self.task_gpus)

    @property
    def instances(self) -> int:
        """Dynamo instances the frontend lists for this role: every vllm rank registers on its own."""
        return self.replicas * (self.dp if self.rank_tasks else 1)


def tasks(engine: str, p: Parallelism, span: int, workers: int, per: int) -> tuple[int, int, bool]:
    """(tasks per node, GPUs per task, one task per rank) for ``workers`` workers per node (``per`` GPUs
    of each per node)."""
    if p.dp > 1 and engine == "vllm":
        return workers * per // p.tp, p.tp, True  # one dynamo.vllm per rank
    if span > 1:
        return 1, per, False  # trtllm: the node's ranks in one task's GPUs
    return workers, p.size, False


def check(inf: DynamoInference) -> None:
    """dp > 1 is vllm's (a process per rank) and the mocker's (simulated); TRT-LLM's attention DP is over tp."""
    d = inf.dynamo
    sizes = [("inference", inf.dp)] + [(f"inference.{role}", spec.dp) for role, spec in
                                       (("prefill", inf.prefill), ("decode", inf.decode)) if spec is not None]
    for where, dp in sizes:
        if dp > 1 and d.engine == "trtllm":
            raise UserError(f"{where}.dp", "dynamo.trtllm has no data-parallel size: its attention DP runs over a "
                            "worker's tp MPI ranks (inference.dynamo.attention_dp = true)")
    if d.attention_dp and d.engine != "trtllm":
        how = ("dp > 1 with expert_parallel = true (attention per rank, experts over all ranks)" if d.engine == "vllm"
               else "dp > 1 (the mocker simulates the ranks)")
        raise UserError("inference.dynamo.attention_dp", f"engine {d.engine!r} has no attention-DP flag; its "
                        f"attention DP is {how}")


def rank(role: Role) -> str:
    """Shell arithmetic for this task's data-parallel rank (one task per rank)."""
    if role.span == 1:  # a node's tasks are its workers' ranks, worker by worker
        return f"(SLURM_LOCALID % {role.dp})"
    return f"(SLURM_NODEID % {role.span} * {role.per_node} + SLURM_LOCALID)"  # ranks count across the nodes


def args(role: Role, first_index: int) -> list[Arg]:
    """``dynamo.vllm`` as one data-parallel rank (Dynamo's own DP launch: a process per rank): its
    rank, and its worker's first node (``${leader}``, from ``prelude``) and RPC port."""
    if role.span == 1:
        rpc: Arg = Sh(sh=f"$(({ports.shell_var('dprpc_0')} + {first_index} + SLURM_LOCALID / {role.dp}))")
    else:
        rpc = shell.var(f"dprpc_{first_index}")
    return ["--data-parallel-size", str(role.dp), "--data-parallel-rank", Sh(sh=f"$({rank(role)})"),
            "--data-parallel-address", Sh(sh="${leader}"), "--data-parallel-rpc-port", rpc]


def prelude(role: Role, slot: Slot) -> list[str]:
    """``leader``: the first node of this task's worker (its rank 0 serves the DP RPC port)."""
    if not role.rank_tasks:
        return []
    first = f"{slot.first_node} + " if slot.first_node else ""
    return [f'read -ra nodes <<<"${{SLURMRL_NODES_G{slot.group}}}"',
            f"leader=${{nodes[{first}SLURM_NODEID / {role.span} * {role.span}]}}  # first node of this task's worker"]


def rank_ports(role: Role, node: int, local: int, first_index: int) -> dict[str, str]:
    """The DP RPC port on a worker's rank 0."""
    if not role.rank_tasks:
        return {}
    if role.span == 1:
        return {"dp_rpc": f"dprpc_{first_index + local // role.dp}"} if local % role.dp == 0 else {}
    return {"dp_rpc": f"dprpc_{first_index}"} if node % role.span == 0 and local == 0 else {}
