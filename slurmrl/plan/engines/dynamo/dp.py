"""A Dynamo worker role's shape on its nodes, and its data-parallel ranks.

A worker is ``dp`` data-parallel ranks of ``tp`` GPUs each. ``dynamo.vllm`` runs one process per
rank, as Dynamo's own DP launch scripts do (``--data-parallel-size/-rank/-address/-rpc-port``,
each rank registers as its own Dynamo instance and the frontend routes to each), or with
``dp_launch = "per_node"`` one per node of a worker for its node's ranks (vLLM's hybrid load
balancing, srt-slurm's per-node layout); a worker larger than a node spans tp x dp /
GPUs-per-node nodes, its first node's rank 0 serving the DP RPC port (``dprpc_k`` of the port table). ``dynamo.mocker`` simulates the ranks in one process
(``--data-parallel-size``), on one node. ``dynamo.trtllm`` has no DP size: its attention DP runs
over a worker's tp MPI ranks (``--enable-attention-dp``).
"""

from __future__ import annotations

from dataclasses import dataclass

from slurmrl import ports
from slurmrl.contract import job_env
from slurmrl.errors import UserError
from slurmrl.plan import shell
from slurmrl.plan.model import Arg, Sh
from slurmrl.plan.parallel import Parallelism, Slice
from slurmrl.plan.spec import Slot
from slurmrl.recipe.dynamo import Dynamo, DynamoInference
from slurmrl.recipe.user_set import user_set


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
    dp_launch: str | None  # dynamo.vllm with dp > 1: "per_rank" or "per_node" (inference.dynamo.dp_launch)

    @property
    def slice(self) -> Slice:
        return Slice(self.span, self.per_node, self.task_gpus)

    @property
    def rank_tasks(self) -> bool:
        """One task per data-parallel rank, each its own Dynamo instance."""
        return self.dp_launch == "per_rank"

    @property
    def node_tasks(self) -> bool:
        """One task per node of a worker, for the node's ranks (vLLM's hybrid load balancing)."""
        return self.dp_launch == "per_node"

    @property
    def dp_local(self) -> int:
        """Data-parallel ranks per task."""
        return self.task_gpus // self.tp if self.dp_launch else 1

    @property
    def instances(self) -> int:
        """Dynamo instances the frontend lists for this role: each dynamo.vllm registers on its own."""
        if self.rank_tasks:
            return self.replicas * self.dp
        return self.replicas * (self.span if self.node_tasks else 1)


def tasks(d: Dynamo, p: Parallelism, span: int, workers: int, per: int) -> tuple[int, int, str | None]:
    """(tasks per node, GPUs per task, DP launch) for ``workers`` workers per node (``per`` GPUs of
    each per node)."""
    if p.dp > 1 and d.engine == "vllm":
        if d.dp_launch == "per_rank":
            return workers * per // p.tp, p.tp, d.dp_launch
        return workers, per, d.dp_launch  # one dynamo.vllm per node of a worker
    if span > 1:
        return 1, per, None  # trtllm: the node's ranks in one task's GPUs
    return workers, p.size, None


def check(inf: DynamoInference) -> None:
    """dp > 1 is vllm's (a process per rank) and the mocker's (simulated); TRT-LLM's attention DP is over tp."""
    d = inf.dynamo
    if inf.mode == "pd" and user_set(inf, "dp"):
        raise UserError("inference.dp", "mode 'pd' sizes each role: set inference.prefill.dp and inference.decode.dp")
    sizes = [("inference", inf.dp)] + [(f"inference.{role}", spec.dp) for role, spec in
                                       (("prefill", inf.prefill), ("decode", inf.decode)) if spec is not None]
    for where, dp in sizes:
        if dp > 1 and d.engine == "trtllm":
            raise UserError(f"{where}.dp", "dynamo.trtllm has no data-parallel size: its attention DP runs over a "
                            "worker's tp MPI ranks (inference.dynamo.attention_dp = true)")
    if user_set(d, "dp_launch") and (d.engine != "vllm" or max(dp for _, dp in sizes) == 1):
        raise UserError("inference.dynamo.dp_launch", "only engine 'vllm' with dp > 1 launches data-parallel ranks")
    if d.attention_dp and d.engine not in ("trtllm", "sglang"):
        how = ("dp > 1 with expert_parallel = true (attention per rank, experts over all ranks)" if d.engine == "vllm"
               else "dp > 1 (the mocker simulates the ranks)")
        raise UserError("inference.dynamo.attention_dp", f"engine {d.engine!r} has no attention-DP flag; its "
                        f"attention DP is {how}")


def rank(role: Role) -> str:
    """Shell arithmetic for this task's (first) data-parallel rank."""
    if role.span == 1:  # a node's tasks are its workers (or their ranks, worker by worker)
        return f"(SLURM_LOCALID % {role.dp})" if role.rank_tasks else "0"
    local = "SLURM_LOCALID" if role.dp_local == 1 else f"SLURM_LOCALID * {role.dp_local}"
    return f"(SLURM_NODEID % {role.span} * {role.per_node * role.dp_local} + {local})"


def args(role: Role, first_index: int) -> list[Arg]:
    """``dynamo.vllm`` as data-parallel ranks of a worker: per rank (``--data-parallel-rank``, as
    Dynamo's own DP scripts), or per node (vLLM's hybrid load balancing: the node's ranks from
    ``--data-parallel-start-rank``); its worker's first node (``${leader}``, from ``prelude``) and RPC port."""
    per_worker = role.dp if role.rank_tasks else 1  # tasks of one worker on a node
    if role.span == 1:
        rpc: Arg = Sh(sh=f"$(({ports.shell_var('dprpc_0')} + {first_index} + SLURM_LOCALID / {per_worker}))")
    else:
        rpc = shell.var(f"dprpc_{first_index}")
    out: list[Arg] = ["--data-parallel-size", str(role.dp)]
    if role.rank_tasks:
        out += ["--data-parallel-rank", Sh(sh=f"$({rank(role)})")]
    else:
        out += ["--data-parallel-size-local", str(role.dp_local), "--data-parallel-start-rank",
                Sh(sh=f"$({rank(role)})") if role.span > 1 else "0", "--data-parallel-hybrid-lb"]
    return out + ["--data-parallel-address", Sh(sh="${leader}"), "--data-parallel-rpc-port", rpc]


def prelude(role: Role, slot: Slot) -> list[str]:
    """``leader``: the first node of this task's worker (its rank 0 serves the DP RPC port)."""
    if not role.dp_launch:
        return []
    first = f"{slot.first_node} + " if slot.first_node else ""
    return [f'read -ra nodes <<<"${{{job_env.nodes_of_group(slot.group)}}}"',
            f"leader=${{nodes[{first}SLURM_NODEID / {role.span} * {role.span}]}}  # first node of this task's worker"]


def rank_ports(role: Role, node: int, local: int, first_index: int) -> dict[str, str]:
    """The DP RPC port on a worker's rank 0."""
    if not role.dp_launch:
        return {}
    if role.span == 1:
        per_worker = role.dp if role.rank_tasks else 1
        return {"dp_rpc": f"dprpc_{first_index + local // per_worker}"} if local % per_worker == 0 else {}
    return {"dp_rpc": f"dprpc_{first_index}"} if node % role.span == 0 and local == 0 else {}
