"""The vLLM engine's recipe rules that need more than one field (``[inference]`` with backend
``vllm``): P/D roles and their connectors, KV offload, expert-parallel flags, the admin endpoints
that hybrid and broadcast weight updates drive, and the KV events vllm-router's kv_aware reads from
its servers. Each failure names its field, one sentence. ``slurmrl.plan.rules`` holds the rules of
every recipe; the router's are ``slurmrl.plan.router_rules``'."""

from __future__ import annotations

from slurmrl.errors import UserError
from slurmrl.plan import router_rules
from slurmrl.plan.model_kind import check_replay
from slurmrl.recipe.recipe import Recipe
from slurmrl.recipe.router import Routed
from slurmrl.recipe.user_set import user_set
from slurmrl.recipe.vllm import VllmInference

PD_ONLY = ("share_nodes", "kv_load_failure_policy", "kv_buffer_device", "kv_connector", "kv_transfer_protocol")
# Fields of [inference.kv_offload] and the offload kinds that use them.
OFFLOAD_FIELDS = {
    "cpu_gb": ("cpu", "cpu_disk", "mooncake"),
    "disk_path": ("cpu_disk", "mooncake"),
    "disk_gb": ("cpu_disk",),
    "mooncake_protocol": ("mooncake",),
    "mooncake_device": ("mooncake",),
}


def check_mode(inf: VllmInference) -> None:
    """What vLLM's mode ``pd`` needs, and what only it reads (the roles: ``slurmrl.plan.rules.check_roles``)."""
    if inf.mode == "pd":
        if inf.router.enabled is False:
            raise UserError("inference.router.enabled", "mode 'pd' needs the router to pair prefill and decode")
        if inf.dp != 1:
            raise UserError("inference.dp", "mode 'pd' sizes each role with prefill/decode dp, tp and replicas; remove dp")
        if inf.expert_parallel is not None:
            raise UserError("inference.expert_parallel", "mode 'pd' sets it per role: prefill.expert_parallel, "
                            "decode.expert_parallel")
        return
    for name in PD_ONLY:
        if user_set(inf, name):
            raise UserError(f"inference.{name}", f"only applies to mode 'pd' (mode is {inf.mode!r})")


def check_connector(inf: VllmInference) -> None:
    if user_set(inf, "kv_transfer_protocol") and inf.kv_connector != "MooncakeConnector":
        raise UserError("inference.kv_transfer_protocol", "only applies to kv_connector 'MooncakeConnector'")
    if user_set(inf, "kv_buffer_device") and inf.kv_connector != "NixlConnector":
        raise UserError("inference.kv_buffer_device", "only applies to kv_connector 'NixlConnector'")


def check_offload(inf: VllmInference) -> None:
    off = inf.kv_offload
    if off.kind != "none" and off.cpu_gb <= 0:
        raise UserError("inference.kv_offload.cpu_gb", f"kind {off.kind!r} needs a CPU budget > 0 GB")
    if off.kind == "cpu_disk" and (not off.disk_path or off.disk_gb <= 0):
        raise UserError("inference.kv_offload.disk_path", "kind 'cpu_disk' needs disk_path and disk_gb > 0")
    for name, kinds in OFFLOAD_FIELDS.items():
        if user_set(off, name) and off.kind not in kinds:
            raise UserError(f"inference.kv_offload.{name}", f"only applies to kv_offload.kind "
                            f"{' or '.join(map(repr, kinds))} (kind is {off.kind!r})")


def check_vllm_extra(inf: VllmInference) -> None:
    """A vLLM argument given once: in ``vllm_extra`` or in an ``extra_args``, not both."""
    given = [("inference.extra_args", inf.extra_args)] + [
        (f"inference.{role}.extra_args", spec.extra_args)
        for role, spec in (("prefill", inf.prefill), ("decode", inf.decode)) if spec is not None]
    for key in inf.vllm_extra:
        flag = "--" + key.replace("_", "-")
        for where, args in given:
            if any(a == flag or a.startswith(flag + "=") or a == "--no-" + flag[2:] for a in args):
                raise UserError("inference.vllm_extra", f"{key} is also in {where} ({flag}); give it once")


def check_experts(r: Recipe, inf: VllmInference) -> None:
    """Routed-expert replay, EPLB and dual-batch overlap: what each needs."""
    if inf.return_routed_experts and inf.mode == "pd":
        raise UserError("inference.return_routed_experts", "vLLM returns routed experts without P/D only "
                        "(its KV connectors do not carry them)")
    if inf.return_routed_experts and inf.kv_offload.kind != "none":
        raise UserError("inference.return_routed_experts", "vLLM does not return routed experts with KV offload; "
                        "set inference.kv_offload.kind = 'none'")
    if inf.return_routed_experts:
        check_replay(r.model.path, "inference.return_routed_experts")
    for name in ("enable_eplb", "enable_dbo"):
        if not getattr(inf, name):
            continue
        if inf.mode == "pd":
            no_ep = [role for role, spec in (("prefill", inf.prefill), ("decode", inf.decode))
                     if spec is not None and not spec.expert_parallel]
            where = " and ".join(f"{role}.expert_parallel" for role in no_ep)
        else:
            ep = inf.expert_parallel if inf.expert_parallel is not None else inf.mode == "wide_ep"
            no_ep, where = ([] if ep else ["inference"]), "expert_parallel"
        if no_ep:
            raise UserError(f"inference.{name}", f"needs expert parallel; set inference.{where} = true")


def check_admin(r: Recipe, inf: VllmInference) -> None:
    """Hybrid sleep and broadcast weight updates drive the servers' admin endpoints."""
    if inf.admin_endpoints is not False:
        return
    if r.placement.colocate == "hybrid":
        raise UserError("inference.admin_endpoints", "colocate = \"hybrid\" puts the servers to sleep and wakes them "
                        "through their admin endpoints (/sleep, /wake_up); remove admin_endpoints = false")
    sync = r.trainer.sync if r.kind == "rl" and r.trainer is not None else None
    if sync is not None and sync.by_broadcast:
        raise UserError("inference.admin_endpoints", f"trainer.weight_sync = {sync.describe()!r} drives vLLM's "
                        "weight-transfer routes, which are admin endpoints; remove admin_endpoints = false")


def block_size_arg(args: list[str]) -> str | None:
    """The ``--block-size`` extra arguments give vLLM (its parser takes the last)."""
    found = None
    for i, a in enumerate(args):
        if a == "--block-size" and i + 1 < len(args):
            found = args[i + 1]
        elif a.startswith("--block-size="):
            found = a.split("=", 1)[1]
    return found


def check_events(inf: Routed, pol: dict[str, str]) -> None:
    """kv_aware reads one KV-event stream per server, in blocks of the size the plan gives the servers
    (after the router's own rules: ``slurmrl.plan.services.router``)."""
    assert isinstance(inf, VllmInference), "the vLLM engine's router"
    r = inf.router
    for name in pol:
        if not router_rules.reads_events(inf, name):
            continue
        which = router_rules.field("policy" if name == "inference" or not r.prefill_policy else "prefill_policy")
        spec = inf.prefill if name == "prefill" else None
        dp = getattr(spec, "dp", 1) if spec is not None else inf.dp
        if inf.mode == "wide_ep" or dp > 1:
            fix = "mode 'replicas'" if inf.mode == "wide_ep" else "dp = 1"
            raise UserError(which, f"kv_aware reads one KV-event stream per {name} server, but a server with "
                            f"data-parallel ranks publishes one per rank, which the plan does not wire; use "
                            f"cache_aware, or {fix}")
        block = router_rules.event_block_size(inf)
        for where, args in (("inference.extra_args", inf.extra_args),
                            (f"inference.{name}.extra_args", spec.extra_args if spec is not None else [])):
            given = block_size_arg(list(args))
            if given is not None and given != str(block):
                raise UserError(where, f"--block-size {given}, but kv_aware reads the {name} servers' KV events in "
                                f"blocks of {block} tokens and gives them --block-size {block}"
                                + ("" if inf.mode == "pd" else "; set inference.router.kv_event_block_size instead"))


def check(r: Recipe, inf: VllmInference) -> None:
    """Every rule of ``[inference]`` with backend ``vllm``, in the order a user meets them."""
    check_mode(inf)
    check_offload(inf)
    check_vllm_extra(inf)
    check_experts(r, inf)
    check_connector(inf)
    check_admin(r, inf)
    router_rules.check_header(inf)
