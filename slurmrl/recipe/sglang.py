"""[inference] with ``backend = "sglang"``: plain SGLang servers (``python -m sglang.launch_server``),
one per replica, behind vllm-router when there are several (it speaks OpenAI HTTP to them)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from slurmrl.recipe.router import Routed, Router
from slurmrl.recipe.serving import Role
from slurmrl.settings.limits import MAX_GPUS_PER_NODE, MAX_JOB_GPUS

TransferBackend = Literal["nixl", "mooncake"]
TRANSFER_HELP = ("`--disaggregation-transfer-backend`: how prefill hands KV to decode; `nixl` (NVIDIA's NIXL) or "
                 "`mooncake` (RDMA); required with mode `pd` (no default: both need the nodes' GPUs and NICs).")


class SglangRole(Role):
    """One side of SGLang's prefill/decode disaggregation: servers of ``tp`` x ``dp`` GPUs (``tp`` with
    data-parallel attention), each spanning tp / GPUs-per-node nodes when larger than a node."""

    tp: int = Field(
        1, ge=1, le=MAX_GPUS_PER_NODE,
        description=f"`--tp-size` of one server; above a node's GPUs it spans whole nodes (1-{MAX_GPUS_PER_NODE}).",
    )
    dp: int = Field(1, ge=1, le=MAX_JOB_GPUS, description=f"`--dp-size` of one server (1-{MAX_JOB_GPUS}).")
    enable_dp_attention: bool = Field(False, description="`--enable-dp-attention` (then dp divides tp).")


class SglangInference(Routed):
    """SGLang servers of the policy (``backend = "sglang"``), kind ``inference`` only."""

    KEY_HINTS: ClassVar[dict[str, str]] = {  # what the loader adds when a key of another engine is set here
        "dynamo": 'set inference.backend = "dynamo" to use it',
        "vllm_extra": "a vLLM-server knob; SGLang servers take their own flags in inference.extra_args",
        "gpu_memory_utilization": "vLLM's; SGLang's is inference.mem_fraction_static",
        "enforce_eager": "vLLM's; SGLang's is --disable-cuda-graph in inference.extra_args",
    }

    backend: Literal["sglang"] = Field(description="`sglang`: SGLang servers (and vllm-router), this table.")
    tp: int = Field(
        1, ge=1, le=MAX_GPUS_PER_NODE,
        description="`--tp-size`: tensor-parallel size of one server; above the GPUs of a node, the server spans "
        f"tp / GPUs-per-node whole nodes (`--nnodes`, `--node-rank`, `--dist-init-addr`; 1-{MAX_GPUS_PER_NODE}).",
    )
    dp: int = Field(
        1, ge=1, le=MAX_JOB_GPUS,
        description="`--dp-size`: data-parallel ranks in one server; a server takes tp x dp GPUs, or tp with "
        f"`enable_dp_attention` (then dp divides tp; 1-{MAX_JOB_GPUS}).",
    )
    enable_dp_attention: bool = Field(
        False, description="`--enable-dp-attention`: data-parallel attention over the tp GPUs (one server per node).",
    )
    mem_fraction_static: float | None = Field(
        None, gt=0, le=1, description="`--mem-fraction-static`: the GPU memory share for weights and KV cache "
        "(above 0, at most 1); default SGLang's.",
    )
    mode: Literal["replicas", "pd"] = Field(
        "replicas", description="`replicas`: independent servers behind vllm-router; `pd`: prefill and decode "
        "servers (`inference.prefill`, `inference.decode`, each role its own het group) behind `sglang-router` "
        "(`python -m sglang_router.launch_router --pd-disaggregation`).",
    )
    router: Router = Field(default_factory=Router, description="The router in front of the servers: vllm-router "
                           "(mode `replicas`), sglang-router (mode `pd`).")
    prefill: SglangRole | None = Field(None, description="`pd`: the prefill servers.")
    decode: SglangRole | None = Field(None, description="`pd`: the decode servers.")
    transfer_backend: TransferBackend | None = Field(None, description=TRANSFER_HELP)
    extra_args: list[str] = Field(default_factory=list, description="Extra `sglang.launch_server` arguments.")
