"""Recipe rules that need more than one field. Each failure is a sentence a user understands."""

from __future__ import annotations

import inspect

from slurmrl.errors import UserError
from slurmrl.recipe.schema import Recipe, global_batch
from slurmrl import envs
from slurmrl.envs import BUILTIN

SECTIONS = {
    "sft": {"trainer": True, "orchestrator": False, "inference": False},
    "rl": {"trainer": True, "orchestrator": None, "inference": True},
    "inference": {"trainer": False, "orchestrator": False, "inference": True},
}


def check_sections(r: Recipe) -> None:
    for section, need in SECTIONS[r.kind].items():
        present = getattr(r, section) is not None
        if need is True and not present:
            raise UserError(section, f"kind {r.kind!r} needs a [{section}] section")
        if need is False and present:
            raise UserError(section, f"is not used by kind {r.kind!r}; remove the [{section}] section")


def check_placement(r: Recipe) -> None:
    p = r.placement
    if p.colocate and r.kind != "rl":
        raise UserError("placement.colocate", f"only applies to kind 'rl' (this recipe is {r.kind!r})")
    if p.share_gpus and not p.colocate:
        raise UserError("placement.share_gpus", "needs placement.colocate = true (trainer and inference on one node)")
    if p.colocate:
        if r.trainer.nodes != 1:
            raise UserError("trainer.nodes", "colocated RL runs on one node; set trainer.nodes = 1 or colocate = false")
        if r.inference.nodes != 1:
            raise UserError("inference.nodes", "colocated RL runs on one node; set inference.nodes = 1")
        if r.inference.mode != "replicas":
            raise UserError("inference.mode", "colocated RL supports mode 'replicas' only")
        if not p.share_gpus and r.inference.gpus_per_node is None:
            raise UserError(
                "inference.gpus_per_node", "colocated RL must say how many of the node's GPUs inference gets"
            )


def check_gpus(r: Recipe) -> None:
    gpn = r.slurm.gpus_per_node
    if gpn == 0:
        raise UserError("slurm.gpus_per_node", f"kind {r.kind!r} needs GPUs; set it to the GPUs on each node")
    for section in ("trainer", "inference"):
        cfg = getattr(r, section)
        if cfg is not None and cfg.gpus_per_node is not None and cfg.gpus_per_node > gpn:
            raise UserError(
                f"{section}.gpus_per_node", f"{cfg.gpus_per_node} is more than the {gpn} GPUs per node (slurm.gpus_per_node)"
            )
        if cfg is not None and cfg.gpus_per_node == 0:
            raise UserError(f"{section}.gpus_per_node", "must be at least 1")


def check_inference(r: Recipe) -> None:
    inf = r.inference
    if inf is None:
        return
    if inf.mode == "pd":
        for role in ("prefill", "decode"):
            if getattr(inf, role) is None:
                raise UserError(f"inference.{role}", "mode 'pd' needs both [inference.prefill] and [inference.decode]")
        if inf.router.enabled is False:
            raise UserError("inference.router.enabled", "mode 'pd' needs the router to pair prefill and decode")
        if inf.kv_offload.kind != "none":
            raise UserError("inference.kv_offload.kind", "KV offload together with mode 'pd' is not supported yet")
        if inf.dp != 1:
            raise UserError("inference.dp", "mode 'pd' sizes each role with prefill/decode replicas and tp; remove dp")
    else:
        for role in ("prefill", "decode"):
            if getattr(inf, role) is not None:
                raise UserError(f"inference.{role}", f"only used with mode 'pd' (mode is {inf.mode!r})")
    off = inf.kv_offload
    if off.kind != "none" and off.cpu_gb <= 0:
        raise UserError("inference.kv_offload.cpu_gb", f"kind {off.kind!r} needs a CPU budget > 0 GB")
    if off.kind == "cpu_disk" and (not off.disk_path or off.disk_gb <= 0):
        raise UserError("inference.kv_offload.disk_path", "kind 'cpu_disk' needs disk_path and disk_gb > 0")
    if inf.expert_parallel and inf.mode == "pd":
        raise UserError("inference.expert_parallel", "set expert parallel per role through prefill/decode extra_args")


def check_trainer(r: Recipe) -> None:
    t = r.trainer
    if t is None:
        return
    if r.kind == "sft" and not t.dataset:
        raise UserError("trainer.dataset", "kind 'sft' needs a JSONL dataset path")
    batch = global_batch(r)
    if r.kind == "rl" and t.batch_size is not None and t.batch_size != batch:
        raise UserError(
            "trainer.batch_size",
            f"RL batches are prompts_per_step x rollouts_per_prompt = {batch}; remove batch_size or make it {batch}",
        )
    if t.micro_batch_size > batch:
        raise UserError("trainer.micro_batch_size", f"{t.micro_batch_size} is larger than the batch of {batch}")
    if t.weight_sync == "nccl":
        if r.kind != "rl":
            raise UserError("trainer.weight_sync", "NCCL weight broadcast only applies to kind 'rl'")
        if r.placement.share_gpus:
            raise UserError(
                "trainer.weight_sync",
                "NCCL cannot broadcast between trainer and inference on the same GPU; use 'filesystem' with share_gpus",
            )
        if r.inference.mode != "replicas":
            raise UserError("trainer.weight_sync", "NCCL weight broadcast supports inference mode 'replicas' only")
        raise UserError(
            "trainer.weight_sync",
            "'nccl' is not implemented yet (the trainer publishes weights to the run dir); use 'filesystem'",
        )


def same_kind(value, default) -> bool:
    """``value`` can stand where ``default`` does (an int is fine for a float; a bool is not an int)."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


def check_orchestrator(r: Recipe) -> None:
    o = r.orchestrator
    if o is None:
        return
    if o.placement == "inference" and r.placement.colocate:
        raise UserError("orchestrator.placement", "colocated RL has one node; use 'trainer' (the same node) or 'own'")
    if o.rollouts_per_prompt < 2:
        raise UserError("orchestrator.rollouts_per_prompt", "group-relative advantages need at least 2 rollouts per prompt")
    if o.environment in BUILTIN:  # custom environments are checked when the orchestrator imports them
        params = inspect.signature(BUILTIN[o.environment]).parameters
        for name in o.environment_args:
            if name not in params:
                raise UserError(f"orchestrator.environment_args.{name}",
                                f"{o.environment!r} takes no argument {name!r} (it takes {', '.join(params) or 'none'})")
            default = params[name].default
            if default is not inspect.Parameter.empty and not same_kind(o.environment_args[name], default):
                raise UserError(f"orchestrator.environment_args.{name}",
                                f"must be {type(default).__name__} like its default {default!r}, "
                                f"not {o.environment_args[name]!r}")
        try:  # built-in environments are cheap to build: check the values too
            BUILTIN[o.environment](**o.environment_args)
        except (TypeError, ValueError) as e:
            raise UserError("orchestrator.environment_args", str(e)) from None
    elif envs.unknown(o.environment):
        raise UserError("orchestrator.environment", envs.unknown(o.environment))


def check(r: Recipe) -> None:
    check_sections(r)
    check_placement(r)
    check_gpus(r)
    check_inference(r)
    check_trainer(r)
    check_orchestrator(r)
