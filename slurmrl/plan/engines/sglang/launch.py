"""What every SGLang process takes, whoever starts it: plain servers (``sglang.launch_server``,
``slurmrl.plan.engines.sglang``), prefill/decode servers (``pd``) and Dynamo's
``dynamo.sglang`` workers (``slurmrl.plan.engines.dynamo.sglang``): a worker's shape on its nodes, its parallel and
model flags, the multi-node launch and the disaggregation flags.

A worker takes ``tp x dp`` GPUs (``tp`` with data-parallel attention, then dp divides tp). One
larger than a node spans ``tp / GPUs-per-node`` whole nodes: the same command on each, ``--nnodes``,
``--node-rank`` from ``SLURM_NODEID`` and ``--dist-init-addr`` on the worker's first node.
SGLang takes its ZeroMQ ports from ``--dist-init-addr``'s port + 1..6 (0.5.23's ``PortArgs``), and
with data-parallel attention on one node from ``--port`` + 233 (outside the job's port block), so
the plan gives ``--dist-init-addr`` whenever either is used: the data-parallel RPC block's first
port (``dprpc_0``, the six after it free: such a worker is alone on its nodes), on the worker's
first node by name (Dynamo 1.4.2 tells decode workers a prefill worker's bootstrap host from it).

P/D: a prefill worker's bootstrap server (``--disaggregation-bootstrap-port``) listens on its
first node at the ``kv_<k>`` port of the port table, the block vLLM's Mooncake bootstrap uses.
"""

from __future__ import annotations

from slurmrl import ports
from slurmrl.contract import job_env
from slurmrl.errors import UserError
from slurmrl.plan import parallel, shell
from slurmrl.plan.context import Context
from slurmrl.plan.model import Arg, Health, Instance, Sh
from slurmrl.plan.parallel import Parallelism, Slice
from slurmrl.plan.spec import Slot, Spec, Supervisor, restart_unless_spanning
from slurmrl.recipe.sglang import SglangInference
from slurmrl.recipe.user_set import user_set

DIST_PORT = "dprpc_0"  # --dist-init-addr's port; SGLang uses the six after it too
BOOTSTRAP_BLOCK = "kv"  # a prefill worker's bootstrap server: kv_<k>, k its per-node index
DTYPES = {"auto": "auto", "bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}  # model.dtype -> --dtype
SERVER = ("-m", "sglang.launch_server")
TRANSFER_BACKENDS = ("nixl", "mooncake")  # --disaggregation-transfer-backend values the plan renders


def parallelism(field: str, tp: int, dp: int, attention: bool) -> Parallelism:
    """A worker's size: tp x dp GPUs, or tp with data-parallel attention."""
    if attention and tp % dp:
        raise UserError(f"{field}.dp", f"with data-parallel attention, dp={dp} must divide tp={tp}")
    return Parallelism(field, tp, 1 if attention else dp)


def span(p: Parallelism, gpn: int) -> tuple[int, int]:
    """(nodes per worker, its GPUs per node); a worker spanning nodes takes DP as attention DP only."""
    nodes, per_gpus = parallel.worker_span(p, gpn, tp_spans=True)
    if nodes > 1 and p.dp > 1:
        raise UserError(f"{p.field}.dp", "a worker spanning nodes takes data parallelism as attention DP only "
                        "(enable_dp_attention = true)")
    return nodes, per_gpus


def local(p: Parallelism, per: int, attention: bool, attention_field: str) -> None:
    """Refusals for ``per`` workers on one node."""
    if per > ports.MAX_LOCAL:
        raise UserError(f"{p.field}.tp", f"{per} workers per node; at most {ports.MAX_LOCAL} are supported")
    if attention and per > 1:
        raise UserError(attention_field, f"{per} workers per node: SGLang takes seven ports from --dist-init-addr "
                        "for each, which the port table gives one worker per node; use tp = the node's GPUs")


def replicas_slice(p: Parallelism, nodes: int, gpn: int, attention: bool, attention_field: str) -> Slice:
    """Workers filling ``nodes`` nodes."""
    n, per_gpus = span(p, gpn)
    if n > 1:
        parallel.whole_workers(p, nodes, n)
        return Slice(span=n, per_node=1, gpus=per_gpus)
    per = parallel.per_node(p, gpn)
    local(p, per, attention, attention_field)
    return Slice(span=1, per_node=per, gpus=p.size)


def role_slice(p: Parallelism, replicas: int, nodes: int | None, gpn: int, attention: bool,
               attention_field: str) -> tuple[Slice, int]:
    """(slice, nodes) of ``replicas`` workers of one P/D role."""
    n, per_gpus = span(p, gpn)
    count, used = parallel.spread(p, replicas, n, per_gpus, gpn, nodes)
    per = 1 if n > 1 else used // p.size
    local(p, per, attention, attention_field)
    return Slice(span=n, per_node=per, gpus=per_gpus if n > 1 else p.size), count


def engine_args(ctx: Context, tp: int, dp: int, attention: bool, mem_fraction: float | None) -> list[Arg]:
    """Parallel sizes, memory share and the model's flags."""
    m = ctx.r.model
    args: list[Arg] = ["--tp-size", str(tp)]
    if dp > 1:
        args += ["--dp-size", str(dp)]
    if attention:
        args.append("--enable-dp-attention")
    if mem_fraction is not None:
        args += ["--mem-fraction-static", repr(mem_fraction)]
    if m.max_model_len is not None:
        args += ["--context-length", str(m.max_model_len)]
    if user_set(m, "dtype"):
        args += ["--dtype", DTYPES[m.dtype]]
    if m.trust_remote_code:
        args.append("--trust-remote-code")
    if ctx.r.log.level != "info":  # SGLang reads its level from its own flag, not from a variable (log_env)
        args += ["--log-level", ctx.r.log.level]
    return args


def multi_node(slot: Slot, shape: Slice, attention: bool, ready: Sh | None) -> tuple[list[str], list[str], list[Arg]]:
    """(prelude, its variables, arguments) of the multi-node launch: a worker spanning nodes learns
    its first node and rank; ``ready``: the URL its first node serves (the others serve no API)."""
    dist = shell.var(DIST_PORT).sh
    if shape.span == 1:  # else SGLang takes its ports at --port + 233, outside the job's block; the node's
        # name, not 127.0.0.1: Dynamo gives a prefill worker's bootstrap host as --dist-init-addr's host
        return [], [], ["--dist-init-addr", Sh(sh=f"$(hostname):{dist}")] if attention else []
    first = f"{slot.first_node} + " if slot.first_node else ""
    prelude = [f'read -ra nodes <<<"${{{job_env.nodes_of_group(slot.group)}}}"',
               f"leader=${{nodes[{first}SLURM_NODEID / {shape.span} * {shape.span}]}}  # this worker's first node",
               f"rank=$((SLURM_NODEID % {shape.span}))"]
    names = ["nodes", "leader", "rank"]
    if ready is not None:
        prelude += [f"ready={ready.sh}", "((rank == 0)) || ready=started  # serves no API"]
        names.append("ready")
    return prelude, names, ["--nnodes", str(shape.span), "--node-rank", Sh(sh="${rank}"), "--dist-init-addr",
                            Sh(sh=f"${{leader}}:{dist}")]


def dist_ports(shape: Slice, attention: bool) -> dict[str, str]:
    """The port --dist-init-addr names, on a worker's first node (SGLang also takes the six after it)."""
    return {"dist": DIST_PORT} if shape.span > 1 or attention else {}


def disaggregation(mode: str | None, backend: str | None, first_index: int = 0, mode_flag: bool = True) -> list[Arg]:
    """``--disaggregation-mode`` (unless the caller gives it), the transfer backend, and a prefill
    worker's bootstrap port (``kv_<k>`` for its per-node index k: SGLang's default 8998 would
    collide between workers)."""
    if mode is None:
        return []
    assert backend in TRANSFER_BACKENDS, "P/D has its transfer backend (checked)"
    args: list[Arg] = ["--disaggregation-mode", mode] if mode_flag else []
    args += ["--disaggregation-transfer-backend", backend]
    if mode == "prefill":
        args += ["--disaggregation-bootstrap-port", Sh(sh=shell.per_task(BOOTSTRAP_BLOCK, first_index))]
    return args


def untried(ctx: Context, backend: str | None) -> None:
    """Say, once, that SGLang's P/D over this transfer backend is rendered and parser-checked only."""
    ctx.warnings.append(f"SGLang's P/D over {backend} has not run with slurmrl: its command lines are checked with "
                        "SGLang's own parser, and the KV transfer needs the nodes' GPUs and RDMA/NVLink NICs")


def bootstrap_ports(mode: str | None, shape: Slice, node: int, index: int) -> dict[str, str]:
    return {"bootstrap": f"{BOOTSTRAP_BLOCK}_{index}"} if mode == "prefill" and shape.leads(node) else {}


# ---- sglang.launch_server: plain servers and P/D servers --------------------------------------
def server_args(ctx: Context, inf: SglangInference, slot: Slot, shape: Slice, tp: int, dp: int, attention: bool,
                first_index: int = 0) -> tuple[list[str], list[str], list[Arg]]:
    """(prelude, its variables, the launch_server arguments before the role's own) of every server task."""
    r = ctx.r
    args: list[Arg] = ["--model-path", ctx.model_path(), "--served-model-name", r.model.served_model_name,
                       "--host", "0.0.0.0", "--port", Sh(sh="${port}"),
                       *engine_args(ctx, tp, dp, attention, inf.mem_fraction_static)]
    prelude = [shell.HOST_LINE, f"port={shell.per_task('server', first_index)}"]
    multi, names, more = multi_node(slot, shape, attention, shell.url("http", Sh(sh="${port}")))
    return [*prelude, *multi], ["host", "port", *names], args + more


def servers(ctx: Context, inf: SglangInference, name: str, slot: Slot, shape: Slice, args: list[Arg], prelude: list[str],
            names: list[str], env: dict, instances: tuple[Instance, ...], completion: bool) -> None:
    """One component of SGLang servers on ``slot``: ``args`` after ``launch_server``."""
    multi = shape.span > 1
    ctx.add(Spec(
        name=name, role="inference", group=slot.group, slot=slot, first_node=slot.first_node,
        nodes=slot.nodes, tasks_per_node=shape.per_node, gpus_per_node=len(slot.gpus), stage=2,
        main=ctx.serving_is_main, fail_fast=False, instances=instances, reads_model=True,
        orchestrated=ctx.r.kind == "rl",
        health=Health(kind="http", ports=tuple(f"server_{i}" for i in range(shape.per_node)),
                      nodes_per_server=shape.span, timeout=inf.startup_timeout,
                      urls_var=f"URLS_{name.upper()}"),
        task=ctx.task(
            Supervisor(name, gpus=shell.gpu_slice(slot.gpus[0], shape.gpus, not multi),
                       ready=Sh(sh="${ready}") if multi else shell.url("http", Sh(sh="${port}")),
                       ready_completion=ctx.r.model.served_model_name if completion else None,
                       fail_on=tuple(inf.fail_on), **restart_unless_spanning(inf, "inference", multi)),
            prelude=[*shell.declare(*names), *prelude], env=sorted(env.items()),
            command=(*ctx.py, *SERVER, *args),
        ),
    ))
