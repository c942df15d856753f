"""vllm-router's policies and their options: which pool routes by which policy, which options a
policy in use reads, and a refusal for every option none reads (it would be silently ignored).

What vllm-router 0.1.17 reads (its ``--help`` and what it logs at start):

- ``cache_aware``: ``cache_threshold``, ``balance_abs_threshold``, ``balance_rel_threshold``,
  ``eviction_interval_secs``, ``max_tree_size``.
- ``kv_aware`` in regular mode (``replicas``): every server's KV-cache events over ZMQ
  (``--kv-event-source WORKER_URL=tcp://HOST:PORT``, blocks of ``kv_event_block_size`` tokens,
  keyed by ``--kv-event-model``, which the router requires), ``router_temperature``, the
  ``kv_penalty_*`` credits and the session-affinity TTL.
- ``kv_aware`` in P/D mode: as the prefill policy, the prefill servers' events
  (``--pd-kv-events``, blocks of 16) and the ``kv_penalty_*`` credits; as the decode policy, the
  session-affinity TTL (decode-only soft affinity). ``router_temperature`` is regular mode only.
- every policy: the request timeout, the payload size, retries.
"""

from __future__ import annotations

from slurmrl.errors import UserError
from slurmrl.recipe.router import Routed, Router
from slurmrl.recipe.user_set import user_set

__all__ = ["Routed"]  # the sections vllm-router fronts (their servers speak OpenAI HTTP), a type each asks

PD_EVENT_BLOCK_SIZE = 16  # vllm-router 0.1.17: "--pd-kv-events ... Block size is 16"

CACHE_AWARE = ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold", "eviction_interval_secs",
               "max_tree_size")
KV_EVENTS = ("kv_penalty_host", "kv_penalty_external", "kv_penalty_disk")  # read with the events
KV_REGULAR = ("router_temperature", "kv_event_block_size", "kv_event_model")  # kv_aware, regular mode only
KV_AFFINITY = ("kv_aware_session_affinity_ttl_secs",)
ANY_POLICY = ("request_timeout_secs", "max_payload_size", "retry_max_retries", "retry_initial_backoff_ms",
              "retry_max_backoff_ms", "retry_backoff_multiplier", "retry_jitter_factor")
OPTIONS = frozenset(CACHE_AWARE + KV_EVENTS + KV_REGULAR + KV_AFFINITY + ANY_POLICY)


def field(name: str) -> str:
    return f"inference.router.{name}"


def flag(name: str) -> str:
    """The vllm-router flag of a Router field (they are named alike)."""
    return "--" + name.replace("_", "-")


def policies(inf: Routed) -> dict[str, str]:
    """The policy of each pool the router picks a server from, by component name."""
    r = inf.router
    if inf.mode == "pd":
        return {"prefill": r.prefill_policy or r.policy, "decode": r.decode_policy or r.policy}
    return {"inference": r.policy}


def reads_events(inf: Routed, name: str) -> bool:
    """Whether the router subscribes to the KV-cache events of component ``name``'s servers."""
    return name in ("inference", "prefill") and policies(inf).get(name) == "kv_aware"


def event_block_size(inf: Routed) -> int:
    """Tokens per KV block in the events the router reads (the servers' ``--block-size``)."""
    return PD_EVENT_BLOCK_SIZE if inf.mode == "pd" else inf.router.kv_event_block_size


def changed(r: Router) -> list[str]:
    """Options set away from vllm-router's defaults, in the recipe's field order."""
    return [n for n, f in Router.model_fields.items() if n in OPTIONS and getattr(r, n) != f.default]


def option_args(inf: Routed) -> list[str]:
    """``--flag VALUE`` for every option that differs from vllm-router's default (``check`` has
    refused those no policy in use reads). ``kv_event_model`` is not here: the caller always gives
    the router a model identity with static event sources."""
    out: list[str] = []
    for name in changed(inf.router):
        if name == "kv_event_model":
            continue
        value = getattr(inf.router, name)
        out += [flag(name), repr(value) if isinstance(value, float) else str(value)]
    return out


def _describe(pol: dict[str, str]) -> str:
    return ", ".join(f"{k} {v!r}" for k, v in pol.items()) if len(pol) > 1 else f"policy {next(iter(pol.values()))!r}"


def _needs(name: str, inf: Routed, pol: dict[str, str]) -> str | None:
    """Why option ``name`` would be ignored with these policies (and what would use it), or None."""
    pd = inf.mode == "pd"
    used = f"the router routes by {_describe(pol)}"
    if name in CACHE_AWARE and "cache_aware" not in pol.values():
        return f"only the cache_aware policy reads it, and {used}; set a policy to cache_aware or leave it out"
    if name in KV_REGULAR:
        if pd:
            blocks = f" (it reads P/D KV events in blocks of {PD_EVENT_BLOCK_SIZE})" \
                if name == "kv_event_block_size" else ""
            return f"vllm-router reads it only with kv_aware in mode 'replicas', not in mode 'pd'{blocks}; leave it out"
        if pol["inference"] != "kv_aware":
            return (f"only the kv_aware policy reads it, and {used}; set inference.router.policy = 'kv_aware' "
                    "or leave it out")
    if name in KV_EVENTS and not any(reads_events(inf, n) for n in pol):
        where = "prefill_policy" if pd else "policy"
        return (f"vllm-router reads it only where kv_aware reads KV events (inference.router.{where} = 'kv_aware'), "
                f"and {used}; leave it out")
    if name in KV_AFFINITY and (pol.get("decode") if pd else pol["inference"]) != "kv_aware":
        where = "decode_policy" if pd else "policy"
        return (f"vllm-router reads it only with inference.router.{where} = 'kv_aware'"
                f"{' (P/D affinity is decode-only)' if pd else ''}, and {used}; leave it out")
    return None


def check(inf: Routed) -> None:
    """Refuse, naming the field, every setting the router that runs would silently ignore (when no
    router runs, ``services.router`` refuses every router setting). The KV events kv_aware reads are
    the engine's to check (vLLM's: ``slurmrl.plan.engines.vllm.rules.check_events``; SGLang refuses
    kv_aware)."""
    r = inf.router
    pol = policies(inf)
    if inf.mode != "pd":
        for name in ("prefill_policy", "decode_policy"):
            if getattr(r, name) is not None:
                raise UserError(field(name), f"only mode 'pd' has prefill and decode pools; mode {inf.mode!r} routes "
                                "by inference.router.policy")
    elif r.prefill_policy and r.decode_policy and user_set(r, "policy"):
        raise UserError(field("policy"), "mode 'pd' with both prefill_policy and decode_policy set does not use it; "
                        "leave it out")
    for name in (n for n in Router.model_fields if n in OPTIONS and user_set(r, n)):
        why = _needs(name, inf, pol)
        if why:
            raise UserError(field(name), why)
    if r.retry_initial_backoff_ms > r.retry_max_backoff_ms:
        raise UserError(field("retry_initial_backoff_ms"), f"{r.retry_initial_backoff_ms} ms is longer than "
                        f"retry_max_backoff_ms ({r.retry_max_backoff_ms})")


def check_header(inf: Routed) -> None:
    header = inf.router.session_header
    if user_set(inf.router, "session_header") and "consistent_hash" not in policies(inf).values():
        raise UserError("inference.router.session_header", "only the consistent_hash policy keys on a session header "
                        f"(the router's policies: {', '.join(sorted(set(policies(inf).values())))}); "
                        "leave it out")
    if header != type(inf.router).model_fields["session_header"].default:  # vllm-router 0.1.17 has no flag for it
        raise UserError("inference.router.session_header", "vllm-router cannot be told which header to hash: "
                        "consistent_hash reads the session headers it knows (X-Session-ID, X-User-ID, X-Tenant-ID, ...) "
                        "in its own order, whichever a request sends; leave it out")
