"""Recipe rules that need more than one field. Each failure is a sentence a user understands."""

from __future__ import annotations

import re

from slurmrl.contract.weight_sync import Broadcast
from slurmrl.errors import UserError
from slurmrl.plan import eval_rules
from slurmrl.plan.env_rules import check_environment, check_kinds
from slurmrl.recipe.orchestrator import Orchestrator
from slurmrl.recipe.recipe import Recipe, global_batch
from slurmrl.recipe.serving import Disaggregated
from slurmrl.recipe.user_set import user_set

SECTIONS: dict[str, dict[str, bool | None]] = {
    "sft": {"trainer": True, "orchestrator": False, "inference": False, "benchmark": False, "eval": False},
    "rl": {"trainer": True, "orchestrator": None, "inference": True, "benchmark": False, "eval": None},
    "inference": {"trainer": False, "orchestrator": False, "inference": True, "benchmark": None, "eval": False},
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
    if changed(p, "colocate") and r.kind != "rl":
        raise UserError("placement.colocate", f"only applies to kind 'rl' (this recipe is {r.kind!r})")
    if changed(p, "share_gpus") and not p.colocate:
        if not p.share_gpus:
            raise UserError("placement.share_gpus", "only applies with placement.colocate; remove it")
        raise UserError("placement.share_gpus", "needs placement.colocate = true (trainer and inference on one node)")
    if p.colocate == "hybrid":
        check_hybrid(r)
    if p.colocate:
        assert r.trainer is not None and r.inference is not None, "colocate is kind rl's (checked above)"
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


def check_hybrid(r: Recipe) -> None:
    """The hybrid engine: vLLM sleeps while the trainer steps on the same GPUs, so generation cannot
    run ahead of training, and the servers need their admin endpoints (/sleep, /wake_up)."""
    if not r.placement.share_gpus:
        raise UserError("placement.share_gpus", "the hybrid engine (colocate = \"hybrid\") runs vLLM and the trainer "
                        "in turns on the same GPUs; set share_gpus = true")
    max_off = (r.orchestrator or Orchestrator()).max_off_policy_steps
    if max_off != 0:
        raise UserError("orchestrator.max_off_policy_steps", f"is {max_off}, but with colocate = \"hybrid\" the servers "
                        "sleep while the trainer steps, so no batch is generated ahead of it; set 0")
    if getattr(r.trainer, "lora", None) is not None:  # level-2 sleep drops the base weights an adapter sits on
        raise UserError("trainer.lora", "a LoRA policy with colocate = \"hybrid\" is not supported yet (the servers "
                        "reload full weights after each sleep); use colocate = true")


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


def check_roles(r: Recipe) -> None:
    """Prefill/decode roles, in every engine's section: mode ``pd`` has both, and sizes by them."""
    inf = r.inference
    if not isinstance(inf, Disaggregated):  # an engine without roles refuses mode 'pd' itself
        return
    for role, spec in inf.roles().items():
        if inf.mode == "pd" and spec is None:
            raise UserError(f"inference.{role}", "mode 'pd' needs both [inference.prefill] and [inference.decode]")
        if inf.mode != "pd" and spec is not None:
            raise UserError(f"inference.{role}", f"only used with mode 'pd' (mode is {inf.mode!r})")
    for name in ("nodes", "tp"):
        if inf.mode == "pd" and changed(inf, name):
            raise UserError(f"inference.{name}", f"mode 'pd' sizes each role: set inference.prefill.{name} and "
                            f"inference.decode.{name}")


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
    if r.kind != "rl" and changed(t, "weight_sync"):  # explicitly 'filesystem' too: nothing is synced
        raise UserError("trainer.weight_sync", f"only applies to kind 'rl' (weights sent to inference servers); "
                        f"kind {r.kind!r} runs none")
    if isinstance(t.sync, Broadcast):
        check_broadcast(r, t.sync)


def check_broadcast(r: Recipe, sync: Broadcast) -> None:
    """``trainer.weight_sync`` by broadcast (vLLM's weight-transfer routes): where it can run."""
    backend = sync.backend
    if r.kind != "rl":
        raise UserError("trainer.weight_sync", f"{backend!r} broadcasts weights to inference: kind 'rl' only")
    assert r.inference is not None and r.trainer is not None, "kind rl has both (check_sections)"
    if sync.between_gpus and r.placement.share_gpus:
        raise UserError("trainer.weight_sync", "NCCL cannot broadcast between trainer and inference on the same "
                        "GPU (placement.share_gpus); use 'ipc'")
    if sync.on_shared_gpu and not r.placement.share_gpus:
        raise UserError("trainer.weight_sync", "'ipc' hands GPU memory over on the same GPU: it needs "
                        "placement.share_gpus = true; use 'nccl' between different GPUs")
    if r.placement.colocate == "hybrid":
        raise UserError("trainer.weight_sync", "the hybrid engine's servers sleep while the trainer steps and "
                        "reload on waking; use 'filesystem' with colocate = 'hybrid'")
    if r.trainer.lora is not None:
        raise UserError("trainer.weight_sync", "a LoRA policy's servers hot-load each step's adapter from the "
                        "run dir; use 'filesystem' with [trainer.lora]")


def check_orchestrator(r: Recipe) -> None:
    o = r.orchestrator
    if o is None:
        return
    if o.placement == "inference" and r.placement.colocate:
        raise UserError("orchestrator.placement", "colocated RL has one node; use 'trainer' (the same node) or 'own'")
    if o.rollouts_per_prompt < 2:
        raise UserError("orchestrator.rollouts_per_prompt", "group-relative advantages need at least 2 rollouts per prompt")
    check_environment("orchestrator", o.environment, o.environment_args)


def check_benchmark(r: Recipe) -> None:
    bench, limit = r.benchmark, r.model.max_model_len
    if bench is None or limit is None:
        return
    longest = max(bench.input_lens) + max(bench.output_lens)
    if longest > limit:
        raise UserError("benchmark.input_lens",
                        f"the longest prompt plus output is {longest} tokens, more than model.max_model_len ({limit})")


def changed(section, name: str) -> bool:
    """``section.name`` was set by the user, whatever its value (``slurmrl.recipe.user_set``)."""
    return user_set(section, name)


def check_slurm_applies(r: Recipe) -> None:
    """[slurm] fields that only some shapes read: the CPU partition, requeue limits, the mail address."""
    s, o = r.slurm, r.orchestrator
    if s.cpu_partition and (o is None or o.placement != "own"):  # '' is left out, like None
        raise UserError("slurm.cpu_partition", "only applies to the orchestrator's own CPU-only group "
                        "(orchestrator.placement = 'own'); the GPU groups use slurm.partition. Remove it "
                        "(or --set slurm.cpu_partition='')")
    if not s.requeue:
        for name in ("max_requeues", "max_total_time"):
            if changed(s, name):
                raise UserError(f"slurm.{name}", "only applies with slurm.requeue = true (this job never requeues); "
                                "remove it")
    if changed(s, "mail_user") and s.mail_user and s.mail_type in (None, "NONE"):
        raise UserError("slurm.mail_user", "only applies with slurm.mail_type (Slurm sends no mail without one, "
                        "e.g. 'END,FAIL')")


def check_applies(r: Recipe) -> None:
    """No silent knobs: a field set where this shape never uses it is refused, saying what applies instead."""
    s, o, t, inf = r.slurm, r.orchestrator, r.trainer, r.inference
    check_slurm_applies(r)
    if changed(s, "heartbeat_timeout") and t is None and o is None:
        raise UserError("slurm.heartbeat_timeout", f"watches the trainer and orchestrator, which kind {r.kind!r} does "
                        "not run; inference servers have inference.startup_timeout")
    if inf is None:
        for name, instead in (("served_name", ""), ("max_model_len", "; the trainer packs to trainer.seq_len"),
                              ("dtype", "; the trainer trains in trainer.dtype")):
            if changed(r.model, name):
                raise UserError(f"model.{name}", f"only applies to inference servers, which kind {r.kind!r} does not "
                                f"run{instead}")
    if t is not None and r.kind == "sft":
        for name in ("clip_eps", "clip_eps_high", "token_mask_low", "token_mask_high", "kl_coef"):
            if changed(t, name):
                raise UserError(f"trainer.{name}", "only applies to kind 'rl' (the SFT loss has no ratio, clip or KL term)")
    if t is not None and changed(t, "weight_sync_timeout") and not t.sync.by_broadcast:
        raise UserError("trainer.weight_sync_timeout", "only applies to weights sent by broadcast (trainer.weight_sync "
                        "= 'nccl', 'ipc' or 'gloo'); the servers reload filesystem weights with no timeout")
    if inf is not None and r.kind != "rl" and changed(inf, "min_servers"):
        raise UserError("inference.min_servers", f"only applies to kind 'rl' (the orchestrator routes around dead "
                        f"servers); in kind {r.kind!r} the router stops sending to a server that does not answer")
    if t is not None and r.kind != "sft" and t.dataset is not None:
        raise UserError("trainer.dataset", f"only applies to kind 'sft'; kind {r.kind!r} trains on the orchestrator's "
                        "rollouts (orchestrator.environment)")


# A hub id (``org/name``) or a URL: what a trainer reading local files cannot open.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_FILE_SUFFIX = re.compile(r"\.[A-Za-z][A-Za-z0-9]*$")  # .jsonl, .json, .gz; not a version such as -v1.5


def check_dataset(r: Recipe) -> None:
    """The trainer opens ``trainer.dataset`` as a local JSONL file (slurmrl/runtime/trainer/data.py); it downloads
    nothing. Decided on the text alone (plan does no I/O); ``submit --preflight`` looks for the file on the node."""
    t = r.trainer
    if t is None or r.kind != "sft" or not t.dataset:
        return
    reads = ("the trainer reads one local JSONL file (prompt/completion or chat messages): an absolute path, or one "
             "relative to the directory the job starts in or to the run dir")
    d = t.dataset
    if "://" in d:
        raise UserError("trainer.dataset", f"{d!r} is a URL; {reads}")
    if _HUB_ID.match(d) and not d.startswith((".", "~")) and not _FILE_SUFFIX.search(d):
        raise UserError("trainer.dataset", f"{d!r} looks like a hub id; {reads} (write './{d}' for a local path)")


def check_sweep(r: Recipe) -> None:
    """A [sweep] recipe is many jobs: `slurmrl sweep` renders each point (without the table)."""
    if r.sweep is not None:
        raise UserError("sweep", "this recipe is a sweep: `slurmrl sweep RECIPE` renders and submits one run dir "
                                 "per point of its grid (`--render-only` to look first)")


def check(r: Recipe) -> None:
    check_sweep(r)
    check_sections(r)
    check_placement(r)
    check_gpus(r)
    check_roles(r)
    check_trainer(r)
    check_orchestrator(r)
    check_benchmark(r)
    check_applies(r)
    check_dataset(r)
    eval_rules.check(r)
    check_kinds(r)  # after both environments are checked
