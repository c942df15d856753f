"""[inference.router]: vllm-router's options."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

from slurmrl.recipe import restart as policy_fields
from slurmrl.recipe.restart import RestartMode
from slurmrl.recipe.serving import Disaggregated
from slurmrl.settings.section import Section

RouterPolicy = Literal[
    "consistent_hash", "round_robin", "random", "power_of_two", "cache_aware", "kv_aware", "sticky_least_loaded"
]


class Router(Section):
    """vllm-router (0.1.17). Each option belongs to a policy; `plan` refuses an option no policy in use
    reads, and renders only values that differ from vllm-router's defaults (the defaults here)."""

    enabled: bool | None = Field(
        None, description="Run vllm-router on the first inference node; default: when there is more than one server."
    )
    policy: RouterPolicy = Field(
        "consistent_hash",
        description="Routing policy: `consistent_hash` keys on `session_header`; `round_robin`, `random`; "
        "`power_of_two` (the less loaded of two random workers); `cache_aware` (prefix tree of past requests "
        "per worker); `kv_aware` (the servers' KV-cache events: each server publishes them over ZMQ); "
        "`sticky_least_loaded` (a session stays on the least loaded worker it first got).",
    )
    prefill_policy: RouterPolicy | None = Field(
        None, description="Mode `pd`: the policy that picks a prefill server; default: `policy`."
    )
    decode_policy: RouterPolicy | None = Field(
        None, description="Mode `pd`: the policy that picks a decode server; default: `policy`."
    )
    session_header: Literal[
        "X-Session-ID", "X-User-ID", "X-Tenant-ID", "X-Request-ID", "X-Correlation-ID", "X-Trace-ID"
    ] = Field(
        "X-Session-ID",
        description="Header clients send to key consistent hashing. vllm-router reads these headers itself, in "
        "this order, and has no option to pick one: any value but the default is refused.",
    )
    cache_threshold: float = Field(
        0.3, ge=0, le=1,
        description="`cache_aware`: prefix-match rate above which a request goes to the worker holding the prefix, "
        "else to the worker with the smallest tree (0-1).",
    )
    balance_abs_threshold: int = Field(
        64, ge=0, le=1_000_000,
        description="`cache_aware`: balance load instead of caching when the most and least loaded workers differ "
        "by more than this many requests and by `balance_rel_threshold` (0-1000000).",
    )
    balance_rel_threshold: float = Field(
        1.5, ge=1, le=1000,
        description="`cache_aware`: ... and when the most loaded worker has more than this many times the least "
        "loaded's requests (1-1000).",
    )
    eviction_interval_secs: int = Field(
        120, ge=1, le=86400, description="`cache_aware`: seconds between prefix-tree evictions (1-86400)."
    )
    max_tree_size: int = Field(
        2**25, ge=1, le=2**32,
        description=f"`cache_aware`: characters each worker's prefix tree keeps, per model (1-{2**32}).",
    )
    router_temperature: float = Field(
        0.0, ge=0, le=100,
        description="`kv_aware`, mode `replicas`: softmax temperature over worker costs; 0 picks the cheapest (0-100).",
    )
    kv_penalty_host: float = Field(
        0.8, ge=0, le=1,
        description="`kv_aware` where it reads KV events: credit for KV blocks held in host memory (0-1).",
    )
    kv_penalty_external: float = Field(
        0.6, ge=0, le=1,
        description="`kv_aware` where it reads KV events: credit for KV blocks in an external store (0-1).",
    )
    kv_penalty_disk: float = Field(
        0.3, ge=0, le=1, description="`kv_aware` where it reads KV events: credit for KV blocks on disk (0-1)."
    )
    kv_aware_session_affinity_ttl_secs: Annotated[int, Field(ge=1, le=31_536_000)] | None = Field(
        None,
        description="`kv_aware` (mode `pd`: the decode policy): keep a session on its worker while it is idle "
        "less than this many seconds; default: no affinity (1-31536000).",
    )
    kv_event_block_size: int = Field(
        16, ge=1, le=1024,
        description="`kv_aware`, mode `replicas`: tokens per KV block; the servers get the same `--block-size` "
        "(mode `pd`: vllm-router reads prefill events in blocks of 16, the prefill servers get 16) (1-1024).",
    )
    kv_event_model: Annotated[str, Field(min_length=1)] | None = Field(
        None,
        description="`kv_aware`, mode `replicas`: the model identity the router keys KV events by; default: the "
        "served model name.",
    )
    request_timeout_secs: int = Field(
        1800, ge=1, le=7 * 86400, description="Seconds a request may take through the router (1-604800)."
    )
    max_payload_size: int = Field(
        512 * 2**20, ge=1024, le=2**34, description=f"Largest request body the router takes (bytes; 1024-{2**34})."
    )
    retry_max_retries: int = Field(
        5, ge=1, le=100, description="Attempts per request across workers; 1 = no retry (1-100)."
    )
    retry_initial_backoff_ms: int = Field(
        50, ge=1, le=3_600_000, description="Milliseconds before the first retry (1-3600000)."
    )
    retry_max_backoff_ms: int = Field(
        30_000, ge=1, le=3_600_000, description="Longest wait between retries, in milliseconds (1-3600000)."
    )
    retry_backoff_multiplier: float = Field(
        1.5, ge=1, le=100, description="Each retry waits this many times longer than the one before (1-100)."
    )
    retry_jitter_factor: float = Field(
        0.2, ge=0, le=1, description="Random share of each retry wait (0-1)."
    )
    extra_args: list[str] = Field(default_factory=list, description="Extra `vllm-router` arguments.")
    restart: RestartMode = policy_fields.mode("the router")
    max_restarts: int = policy_fields.max_restarts("the router")
    restart_backoff_s: int = policy_fields.backoff()


class Routed(Disaggregated):
    """An engine's section whose servers vllm-router may front (they speak OpenAI HTTP): its router
    rules and service (``slurmrl.plan.router_rules``, ``slurmrl.plan.services``) ask this type. It adds
    no field: each such section declares ``router`` in its own order."""

    if TYPE_CHECKING:  # declared by each engine's section (a field here would reorder theirs)
        router: Router
