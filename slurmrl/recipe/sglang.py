"""[inference] with ``backend = "sglang"``: plain SGLang servers (``python -m sglang.launch_server``),
one per replica, behind vllm-router when there are several (it speaks OpenAI HTTP to them)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from slurmrl.recipe.router import Router
from slurmrl.recipe.serving import Serving
from slurmrl.settings.limits import MAX_GPUS_PER_NODE, MAX_JOB_GPUS


class SglangInference(Serving):
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
        "replicas", description="`replicas`: independent servers; `pd` is refused (SGLang's prefill/decode is not "
        "built yet).",
    )
    router: Router = Field(default_factory=Router, description="vllm-router in front of the servers.")
    extra_args: list[str] = Field(default_factory=list, description="Extra `sglang.launch_server` arguments.")
