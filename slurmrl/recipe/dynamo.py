"""[inference] with ``backend = "dynamo"``: NVIDIA Dynamo's services and workers (``[inference.dynamo]``)."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from slurmrl.recipe.fields import EnvMap
from slurmrl.recipe.serving import Disaggregated, Role, VllmFlags
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
    # The frontend's options (Dynamo 1.4's flags): rendered only when they differ from Dynamo's defaults
    # (the defaults here); the KV router's are refused unless router_mode = "kv".
    router_mode: Literal["round-robin", "random", "power-of-two", "least-loaded", "device-aware-weighted", "kv"] | None = Field(
        None, description="The frontend's `--router-mode`: `round-robin` (Dynamo's default), `random`, `power-of-two` "
        "(the less busy of two random workers), `least-loaded` (fewest active requests), `device-aware-weighted` "
        "(by the workers' device type), `kv` (Dynamo's KV router: the worker holding most of the prompt's "
        "cache, weighed against load; the `kv_*`, `router_*`, `track_*`, `queue_*` options below).",
    )
    chat_processor: Literal["dynamo", "vllm", "sglang"] = Field(
        "dynamo", description="The frontend's renderer (`--dyn-chat-processor`): `dynamo` renders chat templates "
        "and parses tool calls and reasoning in Dynamo's own Rust preprocessor; `vllm` or `sglang` in that "
        "engine's Python code, which must be installed beside the frontend.",
    )
    migration_limit: int = Field(
        0, ge=0, le=2**32 - 1, description="`--migration-limit`: times a request moves to another worker when its "
        "worker goes away mid-request (0 = never; 0-4294967295).",
    )
    session_affinity_ttl_secs: int | None = Field(
        None, ge=1, le=31_536_000, description="`--router-session-affinity-ttl-secs`: keep a session on its worker "
        "until it is idle this long (1-31536000 s).",
    )
    active_decode_blocks_threshold: float | None = Field(
        None, ge=0, le=1, description="`--active-decode-blocks-threshold`: a worker whose KV-cache use is above this "
        "fraction is busy and gets no new request (0-1; srt-slurm's `busy-threshold`).",
    )
    active_prefill_tokens_threshold: int | None = Field(
        None, ge=0, le=2**32 - 1, description="`--active-prefill-tokens-threshold`: a worker with more prompt tokens in "
        "prefill than this is busy (0-4294967295).",
    )
    active_prefill_tokens_threshold_frac: float | None = Field(
        None, ge=0, le=1000, description="`--active-prefill-tokens-threshold-frac`: busy above this fraction of the "
        "worker's batched-token budget (0-1000).",
    )
    kv_cache_block_size: int | None = Field(
        None, ge=1, le=2**32 - 1, description="KV router: `--kv-cache-block-size`, tokens per block it hashes "
        "prompts by; default: the workers' own (1-4294967295).",
    )
    router_temperature: float = Field(
        0.0, ge=0, le=1000, description="KV router: `--router-temperature`, softmax sampling over workers' costs "
        "(0 = always the cheapest; 0-1000).",
    )
    kv_overlap_score_credit: float = Field(
        1.0, ge=0, le=1000, description="KV router: `--router-kv-overlap-score-credit`, weight of the prompt blocks "
        "a worker already caches (0-1000).",
    )
    prefill_load_scale: float = Field(
        1.0, ge=0, le=1000, description="KV router: `--router-prefill-load-scale`, weight of a worker's prefill "
        "load (older Dynamo's `--kv-overlap-score-weight`; 0-1000).",
    )
    kv_events: bool = Field(
        True, description="KV router: follow the workers' KV-cache events; `false` (`--no-router-kv-events`): "
        "predict each worker's cache from the routing decisions, for `router_ttl_secs`.",
    )
    router_ttl_secs: float = Field(
        120.0, gt=0, le=31_536_000, description="KV router with `kv_events = false`: `--router-ttl-secs`, how long "
        "a predicted block stays (above 0, at most 31536000).",
    )
    track_active_blocks: bool = Field(
        True, description="KV router: count the blocks of requests in flight as load "
        "(`false`: `--no-router-track-active-blocks`).",
    )
    assume_kv_reuse: bool = Field(
        True, description="KV router, tracking active blocks: assume requests share cached blocks "
        "(`false`: `--no-router-assume-kv-reuse`).",
    )
    track_output_blocks: bool = Field(
        False, description="KV router: count generated tokens' blocks too (`--router-track-output-blocks`).",
    )
    queue_threshold: float | None = Field(
        None, ge=0, le=1000, description="KV router: `--router-queue-threshold`, hold requests in the router while "
        "every worker's prefill load is above this fraction of its token budget (0-1000).",
    )
    queue_policy: Literal["fcfs", "wspt"] = Field(
        "fcfs", description="KV router with `queue_threshold`: `--router-queue-policy`, `fcfs` (tail TTFT) or "
        "`wspt` (shortest first: mean TTFT).",
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
    frontend_args: list[str] = Field(
        default_factory=list, description="Extra `python -m dynamo.frontend` arguments: not the flags of the "
        "options above, nor those the plan sets (`--http-host`, `--http-port`, the planes).",
    )
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


class DynamoInference(VllmFlags, Disaggregated):
    """NVIDIA Dynamo's frontend and workers for the policy (``backend = "dynamo"``), kind ``inference`` only.
    ``gpu_memory_utilization`` and ``enforce_eager`` are read by engine ``vllm``'s workers only."""

    KEY_HINTS: ClassVar[dict[str, str]] = {  # what the loader adds when a key of another engine is set here
        "router": "Dynamo's frontend routes requests: use inference.dynamo.router_mode and its options",
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
