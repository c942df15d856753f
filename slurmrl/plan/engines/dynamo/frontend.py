"""Dynamo's frontend options (``[inference.dynamo]``): the flag each is rendered as, which router
reads it, and a refusal for each one set where nothing reads it.

What Dynamo 1.4's ``python -m dynamo.frontend`` reads (its ``--help`` and ``frontend/main.py``):

- every router mode: ``--router-mode``, the renderer ``--dyn-chat-processor``, request migration,
  session affinity and the busy-worker thresholds (``Router Options``);
- ``--router-mode kv`` only: ``--kv-cache-block-size`` and the ``KV Router Options`` (the frontend
  builds its ``KvRouterConfig`` in kv mode alone; the other modes get none);
- within the KV router: ``--router-ttl-secs`` only without KV events, ``--router-assume-kv-reuse``
  only while tracking active blocks, ``--router-queue-policy`` only with a queue threshold.

Each option is rendered only when it differs from Dynamo's default (the recipe's default). Dynamo
also reads each from a ``DYN_*`` variable, and takes other spellings of some flags: both are refused
where a typed option owns them, so each option has one spelling.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurmrl.errors import UserError
from slurmrl.plan.model import Arg
from slurmrl.recipe.dynamo import Dynamo, DynamoInference
from slurmrl.recipe.user_set import user_set


@dataclass(frozen=True)
class Option:
    flag: str  # for a bool: the flag that turns Dynamo's default over
    env: str  # the variable Dynamo reads as the flag's default
    kv: bool = False  # read by the KV router only
    aliases: tuple[str, ...] = ()  # Dynamo's other spellings of the flag


def _bool(name: str, on: bool, env: str, old: str | None = None) -> Option:
    """A ``--router-NAME`` / ``--no-router-NAME`` pair (and its older ``--NAME`` spelling)."""
    flags = [f"--router-{name}", f"--no-router-{name}"] + ([f"--{old}", f"--no-{old}"] if old else [])
    flag = flags[0] if on else flags[1]
    return Option(flag, env, True, tuple(f for f in flags if f != flag))


OPTIONS = {
    "router_mode": Option("--router-mode", "DYN_ROUTER_MODE"),
    "chat_processor": Option("--dyn-chat-processor", "DYN_CHAT_PROCESSOR"),
    "migration_limit": Option("--migration-limit", "DYN_MIGRATION_LIMIT"),
    "session_affinity_ttl_secs": Option("--router-session-affinity-ttl-secs", "DYN_ROUTER_SESSION_AFFINITY_TTL_SECS"),
    "active_decode_blocks_threshold": Option("--active-decode-blocks-threshold", "DYN_ACTIVE_DECODE_BLOCKS_THRESHOLD"),
    "active_prefill_tokens_threshold": Option("--active-prefill-tokens-threshold",
                                              "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD"),
    "active_prefill_tokens_threshold_frac": Option("--active-prefill-tokens-threshold-frac",
                                                   "DYN_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC"),
    "kv_cache_block_size": Option("--kv-cache-block-size", "DYN_KV_CACHE_BLOCK_SIZE", True),
    "router_temperature": Option("--router-temperature", "DYN_ROUTER_TEMPERATURE", True),
    "kv_overlap_score_credit": Option("--router-kv-overlap-score-credit", "DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT", True),
    "prefill_load_scale": Option("--router-prefill-load-scale", "DYN_ROUTER_PREFILL_LOAD_SCALE", True,
                                 ("--router-kv-overlap-score-weight", "--kv-overlap-score-weight")),
    "kv_events": _bool("kv-events", False, "DYN_ROUTER_USE_KV_EVENTS", "kv-events"),
    "router_ttl_secs": Option("--router-ttl-secs", "DYN_ROUTER_TTL_SECS", True),
    "track_active_blocks": _bool("track-active-blocks", False, "DYN_ROUTER_TRACK_ACTIVE_BLOCKS", "track-active-blocks"),
    "assume_kv_reuse": _bool("assume-kv-reuse", False, "DYN_ROUTER_ASSUME_KV_REUSE", "assume-kv-reuse"),
    "track_output_blocks": _bool("track-output-blocks", True, "DYN_ROUTER_TRACK_OUTPUT_BLOCKS", "track-output-blocks"),
    "queue_threshold": Option("--router-queue-threshold", "DYN_ROUTER_QUEUE_THRESHOLD", True),
    "queue_policy": Option("--router-queue-policy", "DYN_ROUTER_QUEUE_POLICY", True),
}
# read only with another option's value: (option, what it needs, the refusal's reason)
NEEDS = (
    ("router_ttl_secs", lambda d: not d.kv_events, "only read with kv_events = false (the router then predicts "
     "the cache from its own decisions)"),
    ("assume_kv_reuse", lambda d: d.track_active_blocks, "only read while track_active_blocks = true"),
    ("queue_policy", lambda d: d.queue_threshold is not None, "the router queues only with a queue_threshold"),
)
# set by the plan or by typed options: flag -> what sets it
PLAN_FLAGS = {"--http-host": "(the plan: every address)", "--http-port": "(the plan: the port table)",
              "--request-plane": "inference.dynamo.request_plane", "--event-plane": "inference.dynamo.event_plane",
              "--namespace": "(the plan: DYN_NAMESPACE, one per job)",
              # a preset that turns router_mode to kv and overrides the KV router's options above
              "--load-aware": "inference.dynamo's router_mode = \"kv\" with kv_overlap_score_credit = 0, "
                              "kv_events = false, assume_kv_reuse = false"}


def field(name: str) -> str:
    return f"inference.dynamo.{name}"


def check(inf: DynamoInference, envs: list[tuple[str, dict]]) -> None:
    """One line naming the field for an option nothing reads, or spelled a second way."""
    d = inf.dynamo
    mode = d.router_mode or "round-robin"
    for name, opt in OPTIONS.items():
        if opt.kv and user_set(d, name) and mode != "kv":
            raise UserError(field(name), f"read by Dynamo's KV router only (router_mode = \"kv\"; it is {mode!r})")
    for name, needs, why in NEEDS:
        if user_set(d, name) and not needs(d):
            raise UserError(field(name), why)
    check_frontend_args(d)
    owned = {opt.env: name for name, opt in OPTIONS.items()}
    for where, env in envs:
        for key in env:
            if key in owned:
                raise UserError(f"{where}.{key}", f"Dynamo reads it as {field(owned[key])}: set that instead")


def check_frontend_args(d: Dynamo) -> None:
    """No flag of a typed option, and none the plan sets (Dynamo's parser takes an unambiguous prefix of
    a flag too)."""
    for i, arg in enumerate(d.frontend_args):
        flag = arg.split("=", 1)[0]
        if not flag.startswith("--") or len(flag) < 4:
            continue
        for name, opt in OPTIONS.items():
            if any(f.startswith(flag) for f in (opt.flag, *opt.aliases)):
                raise UserError(f"{field('frontend_args')}[{i}]", f"{arg!r} is {field(name)}: set it there")
        for own, where in PLAN_FLAGS.items():
            if own.startswith(flag):
                raise UserError(f"{field('frontend_args')}[{i}]", f"{arg!r} is set by {where}")


def args(d: Dynamo) -> list[Arg]:
    """The frontend's flags for every option that differs from Dynamo's default (``check`` has refused
    those its router does not read)."""
    out: list[Arg] = []
    for name, opt in OPTIONS.items():
        value, default = getattr(d, name), Dynamo.model_fields[name].default
        if value is None or value == default:
            continue
        if isinstance(value, bool):
            out.append(opt.flag)
        else:
            out += [opt.flag, str(value)]
    return out
