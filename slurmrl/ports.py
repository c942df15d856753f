"""The one port table. Every port anything in a job uses is ``PORT_BASE + offset`` from here.

The job script claims ``PORT_BASE`` at run time on every node of the job (see the ports section
of job.sbatch), starting at ``BASE_MIN + (SLURM_JOB_ID % SLOTS) * STRIDE`` and moving to another
block when that one is claimed or in use on a node. Ports are per node, so the table does not
grow with the node count.

No block may overlap a node's ephemeral range (``net.ipv4.ip_local_port_range``: the ports its
kernel hands to outgoing connections, 32768-60999 by default, from 9000 on some GB200 nodes):
the script reads it on every node at claim time and tries only the blocks of ``STRIDE`` ports
between ``LOWEST`` and ``TOP`` that lie outside all of them (``BASE_MIN`` upwards first, then the
ones below it), and stops naming the node and its range when none does.
"""

from __future__ import annotations

BASE_MIN = 10000
STRIDE = 200
SLOTS = 113  # 10000 + 113*200 = 32600: the first tries end below Linux's default ephemeral range (32768+)
LOWEST = 1024  # no block below: binding there needs privileges
TOP = 65536  # every block ends below
MAX_LOCAL = 16  # servers (and GPUs) per node the table has room for
VLLM_EACH = 6  # ports per vLLM server from its VLLM_PORT up (vLLM scans upwards for its internal ones)

_FIXED = {
    "router": 0,
    "router_metrics": 1,
    "mooncake_rpc": 2,
    "mooncake_metadata": 3,
    "mooncake_admin": 4,
    "mooncake_client": 5,
    "torch_rdzv": 6,
    "weight_broadcast": 7,
    "dp_rpc": 8,
    "etcd_client": 9,  # Dynamo: etcd on the head node (discovery)
    "etcd_peer": 10,
    "nats": 11,  # Dynamo: NATS, when a request or event plane is nats
    "nats_monitor": 12,
    "dynamo_frontend": 13,  # Dynamo's OpenAI frontend
    "router_upstream": 14,  # vllm-router itself, on 127.0.0.1, behind the secret's gate on "router"
    "trainer_metrics": 15,  # the trainer's Prometheus /metrics (rank 0), for the [collector]
    "orchestrator_metrics": 96,  # the orchestrator's Prometheus /metrics, for the [collector]
}

# Per-node blocks: one HTTP port, one KV port, one data-parallel RPC port and one KV-event port
# (vllm-router's kv_aware policy) per local server, one NIXL side-channel port per GPU position.
# Blocks sit at fixed offsets from one base, so server k's KV-event port is its HTTP port plus
# offset("kv_events_0") - offset("server_0"): the router derives it from the server's URL.
_BLOCKS = {"server": 16, "kv": 32, "nixl": 48, "dprpc": 64, "kv_events": 80}
# Each vLLM server's VLLM_PORT (vllm_K: its internal ports, found scanning upwards from it): VLLM_EACH
# apart, so servers on one node never race for the same ones.
VLLM_BLOCK = 100


def offset(name: str) -> int:
    if name in _FIXED:
        return _FIXED[name]
    block, _, idx = name.rpartition("_")
    if block in _BLOCKS and idx.isdigit() and int(idx) < MAX_LOCAL:
        return _BLOCKS[block] + int(idx)
    if block == "vllm" and idx.isdigit() and int(idx) < MAX_LOCAL:
        return VLLM_BLOCK + VLLM_EACH * int(idx)
    raise KeyError(f"no port {name!r} in the port table")


def base_expr() -> str:
    """The bash arithmetic the rendered script uses for PORT_BASE."""
    return f"{BASE_MIN} + (SLURM_JOB_ID % {SLOTS}) * {STRIDE}"


def base_for_job(job_id: int) -> int:
    return BASE_MIN + (job_id % SLOTS) * STRIDE


def shell_var(name: str) -> str:
    return "PORT_" + name.upper()
