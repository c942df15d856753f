"""[inference] with ``backend = "dynamo"``: NVIDIA Dynamo's services and workers (``[inference.dynamo]``)."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from slurmrl.recipe.fields import EnvMap
from slurmrl.recipe.serving import Role, Serving, VllmFlags
from slurmrl.settings.limits import MAX_GPUS_PER_NODE, MAX_JOB_GPUS
from slurmrl.settings.section import PathText, Section


class Dynamo(Section):
    """NVIDIA Dynamo in place of vLLM servers + vllm-router (`inference.backend = "dynamo"`): etcd (and NATS
    when a plane needs it) and Dynamo's OpenAI frontend on the first inference node, workers of one engine."""

    engine: Literal["vllm", "trtllm", "sglang", "mocker"] = Field(
        "vllm",
        description="Worker: `python -m dynamo.vllm`, `dynamo.trtllm` (one MPI rank per GPU through "
        "`srun --mpi=pmix` and `trtllm-llmapi-launch`; a worker of `tp` GPUs may then span tp / GPUs-per-node "
        "nodes), `dynamo.sglang` (SGLang's flags; one process per node of a worker, which spans tp / "
        "GPUs-per-node nodes through `--nnodes`, `--node-rank`, `--dist-init-addr`), or `dynamo.mocker` "
        "(Dynamo's simulated engine: no GPU work, for tests and dry runs).",
    )
    engine_config: PathText | None = Field(
        None,
        description="`trtllm`: engine-config YAML for the workers (`--extra-engine-args`; its parallel sizes "
        "must match `tp`). Mode `pd`: the default of both roles.",
    )
    prefill_engine_config: PathText | None = Field(None, description="`trtllm`, mode `pd`: the prefill workers' YAML.")
    decode_engine_config: PathText | None = Field(None, description="`trtllm`, mode `pd`: the decode workers' YAML.")
    request_plane: Literal["tcp", "nats"] = Field(
        "tcp", description="How the frontend sends requests to workers (`--request-plane`); `nats` starts NATS."
    )
    event_plane: Literal["zmq", "nats"] = Field(
        "zmq", description="How workers publish KV and load events (`--event-plane`); `nats` starts NATS."
    )
    router_mode: Literal["round-robin", "random", "kv"] | None = Field(
        None, description="The frontend's `--router-mode`; default: Dynamo's (round-robin)."
    )
    etcd_endpoints: str | None = Field(
        None,
        description="Use this etcd (`http://HOST:PORT`, comma-separated for several) instead of starting one "
        "on the head node.",
    )
    nats_server: str | None = Field(
        None, description="Use this NATS server (`nats://HOST:PORT`) instead of starting one when a plane is `nats`."
    )
    attention_dp: bool = Field(
        False, description="Engine `trtllm`: attention data parallelism over each worker's tp ranks "
        "(`--enable-attention-dp`; its attention DP size is tp). Engine `sglang`: `--enable-dp-attention`, `dp` "
        "ranks over each worker's tp GPUs (dp divides tp). Engine `vllm`'s is `dp` > 1 with `expert_parallel`.",
    )
    dp_launch: Literal["per_rank", "per_node"] = Field(
        "per_rank",
        description="Engine `vllm` with dp > 1: `per_rank`: one `dynamo.vllm` per data-parallel rank "
        "(`--data-parallel-rank`, as Dynamo's own DP scripts); `per_node`: one per node of a worker for its node's "
        "ranks (`--data-parallel-size-local`, `--data-parallel-start-rank`, `--data-parallel-hybrid-lb`).",
    )
    speedup_ratio: float | None = Field(
        None, ge=0, le=1_000_000,
        description="`mocker`: simulated time runs this many times faster (0 = no delays; 0-1000000).",
    )
    # ---- engine "sglang" only ----
    transfer_backend: Literal["nixl", "mooncake"] | None = Field(
        None, description="Engine `sglang`, mode `pd`: `--disaggregation-transfer-backend`, how prefill workers "
        "hand KV to decode workers (required: both need the nodes' GPUs and RDMA NICs).",
    )
    mem_fraction_static: float | None = Field(
        None, gt=0, le=1, description="Engine `sglang`: `--mem-fraction-static`, the GPU memory share for weights "
        "and KV cache (above 0, at most 1); default SGLang's.",
    )
    # ---- end of engine "sglang" ----
    frontend_args: list[str] = Field(default_factory=list, description="Extra `python -m dynamo.frontend` arguments.")
    extra_args: list[str] = Field(default_factory=list, description="Extra arguments for every worker.")
    env: EnvMap = Field(
        default_factory=dict, description="Environment for every Dynamo process (etcd, NATS, frontend, workers)."
    )

    @field_validator("etcd_endpoints")
    @classmethod
    def _etcd(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"https?://[^\s,/]+(,https?://[^\s,/]+)*", v):
            raise ValueError(f"{v!r} is not http://HOST:PORT (comma-separated for several)")
        return v

    @field_validator("nats_server")
    @classmethod
    def _nats(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"(nats|tls)://[^\s,/]+", v):
            raise ValueError(f"{v!r} is not nats://HOST:PORT")
        return v


DP_DESCRIPTION = (
    "Data-parallel ranks per worker (`--data-parallel-size`), each of tp GPUs. Engine `vllm`: one "
    "`dynamo.vllm` per rank (`--data-parallel-rank`, Dynamo routes to each), a worker of tp x dp GPUs larger "
    "than a node spans tp x dp / GPUs-per-node nodes; with `expert_parallel` this is vLLM's attention DP. "
    "Engine `sglang`: `--dp-size` of one `dynamo.sglang` worker (tp x dp GPUs on one node, or tp with "
    "`attention_dp`). "
    f"Engine `mocker`: one process simulates the ranks, on one node. Not engine `trtllm` (1-{MAX_JOB_GPUS})."
)


class DynamoRole(Role):
    """One side of Dynamo's prefill/decode disaggregation: workers of ``tp`` x ``dp`` GPUs."""

    dp: int = Field(1, ge=1, le=MAX_JOB_GPUS, description=DP_DESCRIPTION)


class DynamoInference(VllmFlags, Serving):
    """NVIDIA Dynamo's frontend and workers for the policy (``backend = "dynamo"``), kind ``inference`` only.
    ``gpu_memory_utilization`` and ``enforce_eager`` are read by engine ``vllm``'s workers only."""

    KEY_HINTS: ClassVar[dict[str, str]] = {  # what the loader adds when a key of another engine is set here
        "router": "Dynamo's frontend routes requests: use inference.dynamo.router_mode and frontend_args",
        "extra_args": "Dynamo workers take inference.dynamo.extra_args (every worker) and prefill/decode extra_args",
        "nodes_per_worker": "Dynamo workers are sized by tp x dp (and nodes)",
        "kv_offload": "KV offload is vLLM-server configuration; pass the engine's own flags in "
                      "inference.dynamo.extra_args",
        "admin_endpoints": "the admin endpoints are vLLM server routes",
        "max_lora_rank": "runtime LoRA loading goes through vLLM's admin endpoints",
        "tool_call_parser": "Dynamo's frontend parses tool calls with its own flag (inference.dynamo.frontend_args)",
        **{k: "vLLM P/D configuration; Dynamo's disaggregation moves KV itself" for k in (
            "kv_connector", "kv_transfer_protocol", "kv_load_failure_policy", "kv_buffer_device", "share_nodes")},
        **{k: "a vLLM-server knob; Dynamo workers take their engine's flags in inference.dynamo.extra_args"
           for k in ("return_routed_experts", "enable_eplb", "enable_dbo", "vllm_extra")},
    }

    backend: Literal["dynamo"] = Field(description="`dynamo`: NVIDIA Dynamo's frontend and workers, this table.")
    mode: Literal["replicas", "pd"] = Field(
        "replicas", description="`replicas`: aggregated workers; `pd`: prefill and decode workers (each role its "
        "own het group).",
    )
    tp: int = Field(
        1, ge=1, le=MAX_GPUS_PER_NODE,
        description="GPUs per worker (its tensor-parallel size); engine `trtllm`'s workers may span nodes "
        f"(1-{MAX_GPUS_PER_NODE}).",
    )
    dp: int = Field(1, ge=1, le=MAX_JOB_GPUS, description=DP_DESCRIPTION)
    expert_parallel: bool = Field(
        False, description="Engine `vllm`: `--enable-expert-parallel` for the aggregated workers."
    )
    prefill: DynamoRole | None = Field(None, description="`pd`: the prefill workers.")
    decode: DynamoRole | None = Field(None, description="`pd`: the decode workers.")
    dynamo: Dynamo = Field(default_factory=Dynamo, description="Dynamo's services and its workers' engine.")
