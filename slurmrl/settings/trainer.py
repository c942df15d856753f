"""The trainer's settings: ``RUN_DIR/components/trainer.toml``, read by ``slurmrl.runtime.trainer``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from slurmrl.contract.weight_sync import Filesystem
from slurmrl.settings.limits import MAX_SEED, MAX_STEPS, MAX_TOKENS
from slurmrl.settings.read import read
from slurmrl.settings.section import PathText, PosInt, Section, WeightSyncValue
from slurmrl.settings.wandb import WandbSettings

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CpStyle = Literal["ulysses", "ring"]
MODULE_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def _check_targets(names: list[str]) -> list[str]:
    for n in names:
        if not MODULE_NAME_RE.match(n):
            raise ValueError(f"{n!r} is not a module name (the last part of a Linear layer's name, e.g. q_proj)")
    if len(set(names)) != len(names):
        raise ValueError("a module is named twice")
    return names


def _absolute(text: str) -> str:
    if not text.startswith("/"):
        raise ValueError(f"{text!r} is not an absolute path; give a node-local folder such as /tmp/slurmrl-checkpoints")
    return text


class Lora(Section):
    """A LoRA policy: the trainer trains low-rank adapters on the frozen base model, and each step's
    adapter (megabytes) is hot-loaded into the inference servers instead of the full weights."""

    rank: int = Field(16, ge=1, le=512, description="Adapter rank r (1-512; inference.max_lora_rank must be at "
                      "least this, and is set to the smallest rank vLLM accepts when left out).")
    alpha: float = Field(32.0, gt=0, le=65536, description="Scaling numerator: the update is B @ A x alpha / rank "
                         "(above 0, at most 65536).")
    dropout: float = Field(0.0, ge=0, le=0.9, description="Dropout on the adapter's input while training "
                           "(0-0.9).")
    target_modules: Annotated[list[str], AfterValidator(_check_targets)] = Field(
        default_factory=lambda: list(LORA_TARGETS), min_length=1, max_length=64,
        description="Linear layers that get adapters, by the last part of their name (every layer whose name ends "
        "so); default the attention and MLP projections of Llama/Qwen/Mistral-style models. vLLM loads adapters "
        "on these modules of its supported architectures.",
    )


class Parallel(Section):
    """The trainer's device mesh (``[trainer.parallel]``; names as prime-rl and torchtitan users write them):
    ``dp_replicate x dp_shard x cp`` = the trainer's processes; ``ep`` borrows its ranks from ``dp_shard x cp``."""

    dp_replicate: int = Field(1, ge=1, le=65536, description="Data-parallel replicas: groups that each hold a whole "
                              "sharded copy of the model (HSDP; 1-65536).")
    dp_shard: Annotated[int, Field(ge=1, le=65536)] | None = Field(
        None, description="Ranks each replica shards parameters, gradients and optimizer state over (FSDP2; "
        "1-65536); default: the trainer's processes / (dp_replicate x cp).")
    cp: int = Field(1, ge=1, le=1024, description="Context parallel: ranks one packed row is split over by sequence "
                    "(1-1024). Must divide trainer.seq_len (ring: 2 x cp must) and, for Ulysses, the model's "
                    "attention heads.")
    cp_style: CpStyle | None = Field(
        None, description="How attention sees the whole row under cp: 'ulysses' (an all-to-all swaps sequence for "
        "heads: cp must divide the model's attention heads) or 'ring' (K/V passed round the cp ranks, any head "
        "count, rows in 2 x cp zigzag chunks); default: ulysses where cp divides the attention heads, else ring "
        "(decided at plan from the model's config.json or a well-known hub id's listed shape, else by the trainer at "
        "start).")
    ep: int = Field(1, ge=1, le=1024, description="Expert parallel (MoE only): ranks a layer's experts are split "
                    "over, tokens sent to their experts' ranks (1-1024). Must divide dp_shard x cp and the "
                    "model's expert count (read at plan where it can be, else checked by the trainer at load); "
                    "not with trainer.lora or dp_replicate > 1.")


    def style_for(self, heads: int | None) -> CpStyle | None:
        """``cp_style``, or where none is set: Ulysses where ``cp`` divides ``heads``, else ring (None: heads unknown)."""
        if self.cp_style is not None or heads is None:
            return self.cp_style
        return "ulysses" if heads % self.cp == 0 else "ring"

    def describe(self) -> str:
        """One line for ``slurmrl plan``: the mesh as plan resolved it (``dp_shard`` filled in)."""
        assert self.dp_shard is not None, "described once plan has resolved it (slurmrl.plan.mesh.resolve)"
        world = self.dp_replicate * self.dp_shard * self.cp
        style = self.cp_style or "ulysses or ring by the model's heads, at start"
        return (f"Trainer mesh: dp_replicate {self.dp_replicate} x dp_shard {self.dp_shard} x cp {self.cp}"
                + (f" ({style})" if self.cp > 1 else "") + f" = {world} "
                f"process(es); ep {self.ep}" + (" (experts split over dp_shard x cp)" if self.ep > 1 else ""))


class TrainerKnobs(Section):
    """The trainer fields its program reads. ``slurmrl.settings.trainer.TrainerSettings`` extends
    this with what the planner derives, so a default lives here and nowhere else."""

    dataset: PathText | None = Field(
        None,
        description="SFT: one local JSONL file (prompt/completion or chat messages): an absolute path, or relative "
        "to where the job starts or to the run dir. The trainer downloads nothing: a hub id or URL is refused.",
    )
    lr: float = Field(1e-5, gt=0, le=1, description="AdamW learning rate (above 0, at most 1).")
    weight_decay: float = Field(0.0, ge=0, le=1, description="AdamW weight decay (0-1).")
    max_grad_norm: float = Field(
        1.0, gt=0, le=1e6,
        description="Clip the global gradient norm to this before each step (above 0, at most 1000000; "
        "a large value leaves gradients unclipped).",
    )
    micro_batch_size: int = Field(4, ge=1, le=4096, description="Sequences per forward/backward per GPU (1-4096).")
    seq_len: int = Field(
        2048, ge=1, le=MAX_TOKENS, description=f"Maximum tokens per sequence (packing length for SFT; 1-{MAX_TOKENS})."
    )
    max_steps: int = Field(100, ge=1, le=MAX_STEPS, description=f"Optimizer steps to run (1-{MAX_STEPS}).")
    checkpoint_every: int = Field(10, ge=1, le=MAX_STEPS, description=f"Steps between checkpoints (1-{MAX_STEPS}).")
    keep_checkpoints: int = Field(3, ge=1, le=1000, description="Checkpoints to keep (1-1000).")
    checkpoint_stage_dir: Annotated[PathText, AfterValidator(_absolute)] | None = Field(
        None,
        description="A node-local folder (absolute, e.g. /tmp/slurmrl-checkpoints): each rank writes its part of "
        "a checkpoint there, and a background thread copies it to the run dir's checkpoints/ while training goes "
        "on; it becomes visible by the same one rename after every rank's copy is synced. The next save, and the "
        "end of training, wait for the copy; after a stop it has slurm.grace_seconds, else it is dropped whole. "
        "Default: none (written to the run dir directly).",
    )
    gradient_checkpointing: bool | Literal["auto"] = Field(
        "auto",
        description='Recompute activations in backward: true or false to force it, "auto" to recompute only where '
        "the step's estimated activations would not fit in the device's memory.",
    )
    compile: bool = Field(
        True, description="On CUDA, torch.compile each decoder layer (false: run eager; the CPU never compiles).",
    )
    dtype: Literal["bfloat16", "float32"] = Field("bfloat16", description="Training dtype (fp32 where no bf16).")
    clip_eps: float = Field(
        0.2, gt=0, le=1, description="RL: importance-ratio clip range, ratios outside 1 +- clip_eps (above 0, at most 1)."
    )
    clip_eps_high: float | None = Field(
        None, gt=0, le=10, description="RL: the upper clip, ratios above 1 + clip_eps_high are clipped (DAPO's "
        "clip-higher: above clip_eps lets rare tokens gain more per step; above 0, at most 10); default: clip_eps.",
    )
    token_mask_low: float | None = Field(
        None, gt=0, le=1, description="RL: a token whose importance ratio (trainer / inference probability) is below "
        "this is left out of the loss (masked importance sampling; above 0, at most 1); default: none masked.",
    )
    token_mask_high: float | None = Field(
        None, gt=1, le=1e6, description="RL: ... and one whose ratio is above this (above 1, at most 1000000); "
        "default: none masked. The share dropped is `masked_frac` in metrics/trainer.jsonl.",
    )
    kl_coef: float = Field(0.0, ge=0, le=10, description="RL: KL penalty to the reference model (0 = off; 0-10).")
    seed: int = Field(0, ge=0, le=MAX_SEED, description=f"Random seed (0-{MAX_SEED}).")
    peak_tflops: float | None = Field(
        None, gt=0, le=1e6,
        description="Peak dense TFLOP/s of one trainer device in the training dtype, for the MFU metric (above 0, "
        "at most 1000000); default: the datasheet figure of known GPUs in bfloat16 (A100, H100, H200, B200, "
        "GB200), else none and MFU is not reported.",
    )
    parallel: Parallel = Field(
        default_factory=Parallel,
        description="The trainer's device mesh (`[trainer.parallel]`: dp_replicate, dp_shard, cp, ep); checked "
        "against its GPUs, seq_len and the model's heads and experts at plan. See docs/rl.md.",
    )
    lora: Lora | None = Field(
        None,
        description="RL: train a LoRA adapter instead of the full weights (`[trainer.lora]`); the servers hot-load "
        "each step's adapter, and the KL reference is the base model with adapters off. See docs/rl.md.",
    )




class TrainerSettings(TrainerKnobs):
    """The recipe's trainer fields the program reads (defaults there), plus what the planner derives."""

    run_dir: str = Field(description="The run dir (absolute).")
    kind: Literal["sft", "rl"] = Field(description="SFT from trainer.dataset, or RL from the orchestrator's batches.")
    model: str = Field(description="The model to start from: recipe model.path (hub id or folder).")
    trust_remote_code: bool = Field(False, description="Allow model code from the checkpoint: model.trust_remote_code.")
    world_size: PosInt = Field(description="Trainer processes the plan starts (nodes x GPUs per node).")
    global_batch: PosInt = Field(
        description="Sequences per optimizer step (SFT: trainer.batch_size; RL: prompts x rollouts per step)."
    )
    hybrid: bool = Field(
        False, description="placement.colocate = 'hybrid': return cached GPU memory after each step, before "
        "publishing, so the sleeping vLLM servers can wake into it.",
    )
    weight_sync: WeightSyncValue = Field(
        default_factory=Filesystem, description="trainer.weight_sync and weight_sync_timeout as the planner "
        "decided them (slurmrl.contract.weight_sync): {mode = 'filesystem'} or {mode = 'broadcast', backend, timeout_s}.",
    )
    wandb: WandbSettings = Field(default_factory=WandbSettings, description="Its W&B run ([wandb]).")
    grace_seconds: float | None = Field(
        None, ge=0, description="slurm.grace_seconds: how long after a stop a checkpoint in progress may take to "
        "finish; one that cannot is dropped whole (none: no bound but the job's own SIGKILL).",
    )

    @property
    def root(self) -> Path:
        return Path(self.run_dir)


def load(path: str | Path) -> TrainerSettings:
    return read(TrainerSettings, path)
