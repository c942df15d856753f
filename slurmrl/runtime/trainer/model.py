"""The model as the trainer runs it: loaded from a folder or hub id, checked against the trainer's mesh,
its head untied, LoRA adapters wrapped, the fast path's head and attention installed, its expert slices
kept (``mesh_apply``), activation recompute by policy, layers compiled (CUDA), FSDP2 over the mesh's
device mesh (``numerics``). ``loop.Trainer`` loads the policy and the reference this way; tests and
benchmarks call ``ready_model`` on a model they built.
"""

from __future__ import annotations

from pathlib import Path

import torch

from slurmrl.runtime.trainer import numerics
from slurmrl.runtime.trainer.dist import Dist
from slurmrl.runtime.trainer.mesh import TrainerMesh
from slurmrl.runtime.trainer.token_forward import FastPath
from slurmrl.settings.trainer import Parallel


def resolve(path: str, run_dir: Path) -> tuple[str, Path | None]:
    """A local path (as given, or relative to the run dir) -> (str, Path); else a hub id -> (id, None)."""
    for p in (Path(path), run_dir / path):
        if p.exists():
            return str(p.resolve()), p.resolve()
    return path, None


def untie(model) -> None:
    """Give the LM head its own weight: the published weights are untied (vLLM's reload needs it)."""
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and emb is not None and head.weight is emb.weight:
        head.weight = torch.nn.Parameter(emb.weight.detach().clone())
    model.config.tie_word_embeddings = False
    if getattr(model.config, "get_text_config", None):
        model.config.get_text_config().tie_word_embeddings = False


def load_model(path: str, d: Dist, gradient_checkpointing: bool | str, trainable: bool = True,
               trust_remote_code: bool = False, prepare=None, compile_layers: bool = False,
               micro_tokens: int = 0, log=print, mesh: TrainerMesh | None = None):
    """The model at ``path`` on this rank's device, ready to train (or frozen): see ``ready_model``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=trust_remote_code)
    return ready_model(model, d, gradient_checkpointing, trainable, prepare, compile_layers, micro_tokens, log,
                       mesh)


def ready_model(model, d: Dist, gradient_checkpointing: bool | str, trainable: bool = True, prepare=None,
                compile_layers: bool = False, micro_tokens: int = 0, log=print, mesh: TrainerMesh | None = None):
    """A float32 model made ready as the trainer runs it: checked against the mesh, untied head, LoRA,
    the fast path's head and attention, its expert slices (``mesh.experts``), activation recompute by
    policy, compiled layers (CUDA), FSDP2 over ``mesh.fsdp`` (the expert slices left out); ``mesh``
    None: plain FSDP2 over every rank. -> (model, FastPath)"""
    mesh = mesh or TrainerMesh(Parallel(), d.world, d.rank)
    mesh.check_model(model)
    untie(model)
    if prepare is not None:  # a LoRA policy wraps its layers (and loads its adapter) before sharding
        prepare(model)
    model.config.use_cache = False
    fast = FastPath.prepare(model)
    if not trainable and d.bf16:  # a frozen reference needs no float32 master weights
        model.to(torch.bfloat16)
    model.to(d.device)
    ignored = mesh.experts.apply(model) if mesh.experts is not None else None
    if trainable:
        recompute = gradient_checkpointing
        if recompute == "auto":
            recompute, why = numerics.needs_recompute(model, d.device, d.world, micro_tokens, 2 if d.bf16 else 4)
            log(why)
        if recompute:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    else:
        model.eval()
        model.requires_grad_(False)
    if compile_layers and d.cuda:
        log(f"torch.compile on {numerics.compile_layers(model)} decoder layers")
    if numerics.sharded_always(d.cuda, d.bf16, d.world) and (trainable or d.world > 1):
        numerics.shard(model, mesh.fsdp(d.device.type), d.bf16 and trainable, ignored)
    return model, fast
