"""How the trainer's model computes: precision, sharding, optimizer, compile, activation recompute.

- **Precision**: on a GPU with bfloat16, the model is FSDP2-sharded at every world size, one GPU
  included, with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: float32 master
  weights and AdamW state, bfloat16 weights in the forward and backward (cast once per
  layer per step: on one rank nothing is resharded between forward and backward), residual
  stream and norms in bfloat16, no autocast. Float32 (CPU, or ``dtype = "float32"``): one rank is
  left unsharded, as before.
- **Optimizer**: AdamW, ``fused=True`` on CUDA (one kernel per step), PyTorch's default elsewhere.
- **Compile**: ``torch.compile`` on each decoder layer, on CUDA only, unless ``trainer.compile``
  is false.
- **Activation recompute** (``trainer.gradient_checkpointing``): true/false force it; "auto"
  turns it on only where the step's activations would not fit (``needs_recompute``).
"""

from __future__ import annotations

import torch

# bytes of saved activations per token per decoder layer, in elements of the compute dtype:
# 16 x hidden + 6 x MLP width (input/norm/q/k/v/attention out/o-proj and the gated MLP's three
# [T, I] tensors plus the down-projection input). Qwen3-0.6B: 34 x hidden, as measured on an H100
# (46.1 - 16.3 GiB for one 16k-token micro-batch over 28 layers, ../shared/notes/h100-trainer.md).
HIDDEN_TERMS, MLP_TERMS = 16, 6
HEADROOM = 0.85  # the share of the device's memory the step may plan to use


def decoder_layers(model) -> list[torch.nn.Module]:
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def sharded_always(cuda: bool, bf16: bool, world: int) -> bool:
    """FSDP2 wraps the model at world > 1, and on one GPU too when training in bfloat16."""
    return world > 1 or (cuda and bf16)


def shard(model, mesh, bf16: bool, ignored=None) -> None:
    """FSDP2: ``fully_shard`` per decoder layer, then the root (the embeddings, final norm, LM head), over
    ``mesh`` (``mesh.TrainerMesh.fsdp``: every rank, or with HSDP a 2-D ``(replicate, shard)`` mesh whose
    gradients are reduce-scattered inside a copy and all-reduced across copies).
    ``ignored``: parameters FSDP2 leaves whole on each rank (expert slices: ``mesh_apply``)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
          else MixedPrecisionPolicy())
    keep = mesh.size() == 1  # one rank: nothing to free by resharding, and no second gather/cast in backward
    kw = {"ignored_params": set(ignored)} if ignored else {}
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=not keep, **kw)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=not keep, **kw)


def compile_layers(model) -> int:
    """``torch.compile`` each decoder layer's forward (before sharding; FSDP2's hooks and the
    recompute wrapper stay outside the compiled code); the number compiled."""
    layers = decoder_layers(model)
    for layer in layers:
        layer.forward = torch.compile(layer.forward)
    return len(layers)


def optimizer(params, lr: float, weight_decay: float, cuda: bool) -> torch.optim.Optimizer:
    kw = {"fused": True} if cuda else {}
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), weight_decay=weight_decay, **kw)


def activation_bytes(config, tokens: int, dtype_bytes: int) -> int:
    """Estimated activations a forward keeps for backward without recompute, for ``tokens`` tokens."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = int(cfg.hidden_size)
    mlp = int(getattr(cfg, "intermediate_size", None) or 4 * hidden)
    return tokens * int(cfg.num_hidden_layers) * (HIDDEN_TERMS * hidden + MLP_TERMS * mlp) * dtype_bytes


def step_state_bytes(model, world: int) -> int:
    """This rank's share of gradients and AdamW's two float32 moments (not yet allocated at load)."""
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return (n // max(1, world)) * (4 + 8)


def free_bytes(device: torch.device) -> tuple[int, str]:
    """(bytes this rank may still use, where the figure comes from)."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(min(free, total * HEADROOM)), "cuda free memory"
    import psutil

    return int(psutil.virtual_memory().available * HEADROOM), "available host memory"


def needs_recompute(model, device: torch.device, world: int, tokens: int, dtype_bytes: int) -> tuple[bool, str]:
    """(recompute activations?, the sentence that says why) for a micro-batch of ``tokens``."""
    act = activation_bytes(model.config, tokens, dtype_bytes)
    state = step_state_bytes(model, world)
    free, source = free_bytes(device)
    need = int(act * 1.25) + state
    gib = 2.0**30
    verdict = need > free
    return verdict, (f"gradient_checkpointing auto: {'on' if verdict else 'off'} (activations ~{act / gib:.2f} GiB "
                     f"for {tokens} tokens + grads/optimizer {state / gib:.2f} GiB vs {free / gib:.2f} GiB {source})")
