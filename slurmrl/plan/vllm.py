"""vLLM server arguments for each server the planner places.

Placeholders ``{host:G:N}`` (node N of het group G), ``{host:self}``, ``{port:NAME}`` and
``{run_dir}`` are filled in by the inference runtime on the node, where hosts and
``PORT_BASE`` are known. Everything else is decided here.
"""

from __future__ import annotations

import json

from slurmrl.recipe.schema import Inference, Model


def common_args(model: Model, inf: Inference, tp: int, port: str) -> list[str]:
    args = ["--model", model.path, "--served-model-name", model.served_name or model.path]
    args += ["--host", "0.0.0.0", "--port", f"{{port:{port}}}", "--tensor-parallel-size", str(tp)]
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
    return args


def local_dp_args(dp: int, rpc_port: str) -> list[str]:
    """Data parallel inside one server on one node."""
    if dp == 1:
        return []
    return ["--data-parallel-size", str(dp), "--data-parallel-rpc-port", f"{{port:{rpc_port}}}"]


def wide_ep_args(dp: int, dp_local: int, node: int, group: int, expert_parallel: bool) -> list[str]:
    """One data-parallel deployment across nodes: node 0 serves the API, the rest are headless."""
    args = [
        "--data-parallel-size", str(dp),
        "--data-parallel-size-local", str(dp_local),
        "--data-parallel-address", f"{{host:{group}:0}}",
        "--data-parallel-rpc-port", "{port:dp_rpc}",
    ]
    if node > 0:
        args += ["--headless", "--data-parallel-start-rank", str(node * dp_local)]
    if expert_parallel:
        args.append("--enable-expert-parallel")
    return args


def pd_args(connector: str, role: str, local: int, first_gpu: int, proxy_group: int) -> tuple[list[str], dict[str, str]]:
    """KV transfer settings for one prefill or decode server; returns (args, env).

    NIXL listens on its side-channel port plus the TP rank, so each server's port is
    indexed by its first GPU position: servers on one node never overlap."""
    env: dict[str, str] = {}
    if connector == "NixlConnector":
        cfg = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "{host:self}"
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = f"{{port:nixl_{first_gpu}}}"
    else:
        cfg = {
            "kv_connector": "P2pNcclConnector",
            "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
            "kv_port": f"{{port:kv_{local}}}",
            "kv_connector_extra_config": {
                "proxy_ip": f"{{host:{proxy_group}:0}}",
                "proxy_port": "{port:router}",
                "http_port": f"{{port:server_{local}}}",
            },
        }
    return ["--kv-transfer-config", json.dumps(cfg, separators=(",", ":"))], env


def offload_args(inf: Inference, servers_per_node: int, group: int) -> tuple[list[str], dict[str, str]]:
    """KV-cache offload; the per-node CPU/disk budget is split between the node's servers."""
    off = inf.kv_offload
    share = f"{off.cpu_gb / servers_per_node:g}"
    if off.kind == "cpu":
        return ["--kv-offloading-backend", "native", "--kv-offloading-size", share], {}
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
        return ["--kv-transfer-config", json.dumps(cfg, separators=(",", ":"))], {}
    if off.kind == "mooncake":
        cfg = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}
        env = {
            "MOONCAKE_MASTER": f"{{host:{group}:0}}:{{port:mooncake_rpc}}",
            "MOONCAKE_METADATA_SERVER": f"http://{{host:{group}:0}}:{{port:mooncake_metadata}}/metadata",
            "MOONCAKE_PROTOCOL": off.mooncake_protocol,
        }
        if off.mooncake_device:
            env["MOONCAKE_DEVICE"] = off.mooncake_device
        return ["--kv-transfer-config", json.dumps(cfg, separators=(",", ":"))], env
    return [], {}
