"""[inference] with ``backend = "vllm"`` (the default): vLLM servers, their P/D roles and KV offload;
vllm-router's options have their own module (``slurmrl.recipe.router``)."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal, get_args

from pydantic import AfterValidator, Field

from slurmrl.recipe.router import Routed, Router
from slurmrl.recipe.serving import Role, VllmFlags
from slurmrl.settings.limits import INT64, MAX_GPUS_PER_NODE, MAX_JOB_GPUS, MAX_NODES
from slurmrl.settings.section import PathText, Section

LoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]  # vLLM 0.32's MaxLoRARanks
VLLM_LORA_RANKS: tuple[int, ...] = get_args(LoraRank)

VLLM_ARG_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# vLLM arguments slurmrl writes itself, and the recipe field that sets each
VLLM_OWNED = {
    "model": "model.path", "served_model_name": "model.served_name", "host": "(slurmrl: every interface)",
    "port": "(slurmrl: the port table)", "tensor_parallel_size": "tp", "data_parallel_size": "dp",
    "data_parallel_size_local": "dp", "data_parallel_address": "(slurmrl: the worker's first node)",
    "data_parallel_rpc_port": "(slurmrl: the port table)", "data_parallel_start_rank": "(slurmrl: per node)",
    "headless": "(slurmrl: per node)", "enable_expert_parallel": "expert_parallel", "dtype": "model.dtype",
    "max_model_len": "model.max_model_len", "trust_remote_code": "model.trust_remote_code",
    "gpu_memory_utilization": "inference.gpu_memory_utilization", "enforce_eager": "inference.enforce_eager",
    "enable_lora": "inference.max_lora_rank", "max_lora_rank": "inference.max_lora_rank",
    "middleware": "inference.auth", "kv_transfer_config": "inference.kv_connector / inference.kv_offload",
    "kv_offloading_backend": "inference.kv_offload", "kv_offloading_size": "inference.kv_offload",
    "kv_events_config": "inference.router.policy", "enable_eplb": "inference.enable_eplb",
    "enable_dbo": "inference.enable_dbo", "enable_return_routed_experts": "inference.return_routed_experts",
    "enable_sleep_mode": "placement.colocate", "enable_auto_tool_choice": "inference.tool_call_parser",
    "tool_call_parser": "inference.tool_call_parser",
}


def _check_vllm_extra(args: dict) -> dict:
    for key in args:
        if not VLLM_ARG_RE.match(key):
            raise ValueError(f"{key!r} is not a vLLM argument name (lower case, underscores: max_num_seqs)")
        if key in VLLM_OWNED:
            owner = VLLM_OWNED[key]
            how = f" ({owner[1:-1].removeprefix('slurmrl: ')})" if owner.startswith("(") else f"; use {owner}"
            raise ValueError(f"{key} is set by slurmrl{how}")
    return args


VllmScalar = bool | Annotated[int, Field(ge=INT64[0], le=INT64[1])] | float | str
VllmExtra = Annotated[dict[str, VllmScalar | list[VllmScalar] | dict[str, VllmScalar]], AfterValidator(_check_vllm_extra)]


class KVOffload(Section):
    kind: Literal["none", "cpu", "cpu_disk", "mooncake"] = Field(
        "none", description="KV-cache offload: vLLM native to CPU, CPU then disk, or a Mooncake store."
    )
    cpu_gb: float = Field(
        0, ge=0, le=65536, description="CPU memory per inference node for offloaded KV (GB; 0-65536)."
    )
    disk_path: PathText | None = Field(None, description="`cpu_disk` / `mooncake`: local disk folder for KV.")
    disk_gb: float = Field(0, ge=0, le=2**20, description=f"Disk budget per node (GB; 0-{2**20}).")
    mooncake_protocol: Literal["tcp", "rdma"] = Field("rdma", description="Mooncake transfer protocol.")
    mooncake_device: str | None = Field(None, description="RDMA device names for Mooncake, e.g. `mlx5_0`.")


class PDRole(Role):
    """One side of prefill/decode disaggregation: vLLM servers, each tp x dp GPUs."""

    dp: int = Field(
        1, ge=1, le=MAX_JOB_GPUS,
        description="Data-parallel ranks in one server (worker); a worker of tp x dp GPUs larger than a node "
        f"spans tp x dp / GPUs-per-node nodes: one vLLM deployment, headless ranks on its other nodes (1-{MAX_JOB_GPUS}).",
    )
    nodes_per_worker: Annotated[int, Field(ge=1, le=MAX_NODES)] | None = Field(
        None,
        description="Nodes one worker spans; default: as few as hold its tp x dp GPUs. Give it to spread a worker "
        f"thinner, e.g. when prefill and decode share nodes (1-{MAX_NODES}).",
    )


class VllmInference(VllmFlags, Routed):
    """vLLM servers of the policy (``backend = \"vllm\"``)."""

    KEY_HINTS: ClassVar[dict[str, str]] = {  # what the loader adds when a key of another engine is set here
        "dynamo": 'set inference.backend = "dynamo" to use it',
    }

    backend: Literal["vllm"] = Field(
        "vllm",
        description="The engine, and so the keys this section takes: `vllm`: vLLM servers (and vllm-router), this "
        "table; `dynamo`: NVIDIA Dynamo's frontend and workers; `sglang`: SGLang servers (the next tables).",
    )
    mode: Literal["replicas", "wide_ep", "pd"] = Field(
        "replicas",
        description="`replicas`: independent servers; `wide_ep`: one data-parallel deployment across nodes; "
        "`pd`: prefill/decode disaggregation.",
    )
    tp: int = Field(
        1, ge=1, le=MAX_GPUS_PER_NODE, description=f"Tensor-parallel size, within one node (1-{MAX_GPUS_PER_NODE})."
    )
    dp: int = Field(
        1, ge=1, le=MAX_JOB_GPUS,
        description="Data-parallel ranks in one server (worker). A worker of tp x dp GPUs larger than a node spans "
        "tp x dp / GPUs-per-node nodes (one vLLM deployment, headless ranks on its other nodes) and `nodes` holds "
        "nodes / that many workers. `wide_ep`: default all ranks of all nodes, one deployment "
        f"(1-{MAX_JOB_GPUS}).",
    )
    expert_parallel: bool | None = Field(
        None, description="`--enable-expert-parallel`; default on for `wide_ep`, off otherwise."
    )
    tool_call_parser: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="Tool calls for chat environments with tools: `--enable-auto-tool-choice --tool-call-parser "
        "NAME` on every policy server, NAME one of vLLM's parsers for the model's format (`hermes`, "
        "`llama3_json`, `qwen3_coder`, `mistral`, ...); unset: no tool-call parsing.",
    )
    admin_endpoints: bool | None = Field(
        None,
        description="Expose vLLM's pause / reload_weights / resume endpoints (VLLM_SERVER_DEV_MODE) for live "
        "weight updates; default on for kind `rl`, off otherwise.",
    )
    max_lora_rank: LoraRank | None = Field(
        None,
        description="Enable LoRA adapters loaded at run time (`slurmrl.runtime.vllm.admin lora-load`) up to this rank: "
        f"one of {', '.join(map(str, VLLM_LORA_RANKS))} (what vLLM accepts).",
    )
    kv_connector: Literal["NixlConnector", "MooncakeConnector"] = Field(
        "NixlConnector",
        description="P/D: KV transfer connector: NIXL (decode pulls), or Mooncake's transfer engine (prefill pushes; "
        "vllm-router asks each prefill server's bootstrap port). vLLM 0.32 removed P2pNcclConnector.",
    )
    kv_transfer_protocol: Literal["rdma", "tcp"] = Field(
        "rdma", description="P/D with MooncakeConnector: the transfer engine's protocol."
    )
    kv_load_failure_policy: Literal["fail", "recompute"] = Field(
        "fail",
        description="P/D: when KV from the peer cannot be loaded, fail the request or recompute the missing blocks "
        "(vLLM's `kv_load_failure_policy`).",
    )
    kv_buffer_device: Literal["gpu", "cpu"] = Field(
        "gpu",
        description="P/D with NixlConnector: stage KV in GPU memory, or in host memory (`cpu`: for fabrics "
        "without GPUDirect RDMA).",
    )
    share_nodes: bool = Field(
        False,
        description="P/D: prefill and decode servers on the same nodes, each role on its own GPUs (prefill's "
        "first); the roles' `nodes` must agree.",
    )
    prefill: PDRole | None = Field(None, description="P/D: the prefill role.")
    decode: PDRole | None = Field(None, description="P/D: the decode role.")
    router: Router = Field(default_factory=Router, description="vllm-router in front of the servers.")
    kv_offload: KVOffload = Field(default_factory=KVOffload, description="KV-cache offload.")
    enable_eplb: bool = Field(
        False, description="`--enable-eplb`: expert-parallel load balancing (needs expert parallel in every worker)."
    )
    enable_dbo: bool = Field(
        False, description="`--enable-dbo`: dual-batch overlap of compute and expert all-to-all (needs expert parallel)."
    )
    return_routed_experts: bool = Field(
        False,
        description="`--enable-return-routed-experts` (with `VLLM_USE_V2_MODEL_RUNNER=1`): responses carry the "
        "experts each token was routed to, and the RL trainer routes those tokens to them (router replay, "
        "docs/rl.md); a mixture-of-experts model only (by its config.json where the folder is on "
        "the planning machine, else by its name); not with mode `pd` or KV offload, which vLLM "
        "does not support with it.",
    )
    vllm_extra: VllmExtra = Field(
        default_factory=dict,
        description="vLLM engine arguments by name, e.g. `{ max_num_seqs = 256, enable_chunked_prefill = true }`: "
        "`--max-num-seqs 256`, `--enable-chunked-prefill` (false: `--no-...`; tables and lists as JSON). Names "
        "slurmrl sets itself are refused with the field that sets them.",
    )
    extra_args: list[str] = Field(default_factory=list, description="Extra `vllm serve` arguments.")
