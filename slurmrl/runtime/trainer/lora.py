"""A LoRA policy: low-rank adapters on a frozen base model, published in PEFT's format for vLLM.

Our own small implementation, not ``peft``: peft is not a dependency here (not in the job's
environment nor in ``.venv``), and what the trainer needs is small: one module that wraps a
``nn.Linear`` (base weight frozen, ``lora_A``/``lora_B`` trained), a switch that turns every
adapter off (the KL reference is the base model: no second copy in memory), and the files that
vLLM's LoRA loader reads. The wrapper keeps the base weight under its own name (``q_proj.weight``),
so FSDP2 shards it like the rest of the decoder layer and a full state dict is the base model's
plus ``...q_proj.lora_A.weight`` / ``lora_B.weight``.

Files (vLLM reads PEFT's layout: ``/v1/load_lora_adapter`` with ``lora_path`` = the folder):

- ``adapter_config.json``: ``peft_type`` LORA, ``r``, ``lora_alpha``, ``target_modules``, ...
- ``adapter_model.safetensors``: ``base_model.model.<module>.lora_A.weight`` ([r, in]) and
  ``lora_B.weight`` ([out, r]); the update is ``B @ A * lora_alpha / r``.

Merge and export (``python -m slurmrl.runtime.trainer.lora merge BASE ADAPTER OUT``, and the
trainer after its last step into ``RUN_DIR/merged``): ``W + B @ A * alpha / r`` into a plain HF
model folder that any engine loads without LoRA support.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from slurmrl.runtime.step_files import step_name

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
KEYS = ("lora_A", "lora_B")


class LoRALinear(nn.Module):
    """``y = x W^T + b + dropout(x) A^T B^T * alpha / r``; ``enabled = False`` gives the base layer."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float):
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight  # same Parameter objects: the state dict keeps the base model's names
        self.bias = base.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        kw = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, **kw)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, **kw)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))  # as peft: A random, B zero, so the
        nn.init.zeros_(self.lora_B.weight)  # adapter starts as the base model
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.scaling = alpha / rank
        self.enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        if self.enabled:
            out = out + self.lora_B(self.lora_A(self.dropout(x))) * self.scaling
        return out

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, r={self.lora_A.out_features}, scaling={self.scaling:g}"


def inject(model: nn.Module, rank: int, alpha: float, dropout: float, targets: list[str]) -> list[str]:
    """Wrap every ``nn.Linear`` whose name ends in one of ``targets``; freeze everything else.
    Returns the wrapped modules' names. A target that matches nothing is an error (one line)."""
    model.requires_grad_(False)
    linear = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    chosen = [(n, m) for n, m in linear if n.rsplit(".", 1)[-1] in targets]
    found = {n.rsplit(".", 1)[-1] for n, _ in chosen}
    missing = [t for t in targets if t not in found]
    if missing:
        have = sorted({n.rsplit(".", 1)[-1] for n, _ in linear})
        raise SystemExit(f"slurmrl: trainer: trainer.lora.target_modules: {', '.join(map(repr, missing))} "
                         f"match(es) no Linear layer of the model (its Linear layers: {', '.join(have)})")
    for name, module in chosen:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(module, rank, alpha, dropout))
    return [n for n, _ in chosen]


def adapters(model: nn.Module) -> list[LoRALinear]:
    return [m for m in model.modules() if isinstance(m, LoRALinear)]


@contextlib.contextmanager
def disabled(model: nn.Module):
    """Every adapter off inside the block: the model computes as its frozen base."""
    mods = adapters(model)
    before = [m.enabled for m in mods]
    for m in mods:
        m.enabled = False
    try:
        yield model
    finally:
        for m, e in zip(mods, before):
            m.enabled = e


class AdaptersOff:
    """The KL reference: the policy model called with its adapters off (no second copy of the base)."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __call__(self, *args, **kwargs):
        with disabled(self.model):
            return self.model(*args, **kwargs)


def is_lora_key(name: str) -> bool:
    return any(f".{k}." in name for k in KEYS)


def adapter_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's full tensors on CPU under PEFT's names, on every rank. Collective under FSDP2
    (each rank gathers its shards of the adapter only: megabytes, not the model)."""
    out = {}
    for name, p in model.named_parameters():
        if not is_lora_key(name):
            continue
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        out[PEFT_PREFIX + name] = t.to("cpu", copy=True)
    return out


def adapter_config(rank: int, alpha: float, dropout: float, targets: list[str], base: str) -> dict:
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha, "lora_dropout": dropout,
        "target_modules": list(targets), "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
        "modules_to_save": None, "base_model_name_or_path": base, "inference_mode": True,
    }


def write_adapter(out: Path, tensors: dict[str, torch.Tensor], config: dict, dtype: torch.dtype) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(dtype=dtype).contiguous() for k, v in tensors.items()}, str(out / WEIGHTS),
              metadata={"format": "pt"})
    (out / CONFIG).write_text(json.dumps(config, indent=1) + "\n")


def read_adapter(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    return json.loads((path / CONFIG).read_text()), load_file(str(path / WEIGHTS))


def load_into(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy a saved adapter into the (not yet sharded) model's adapter parameters; all must be there."""
    params = {PEFT_PREFIX + n: p for n, p in model.named_parameters() if is_lora_key(n)}
    missing = sorted(set(params) - set(tensors))
    extra = sorted(set(tensors) - set(params))
    if missing or extra:
        raise SystemExit(f"slurmrl: trainer: the saved adapter does not fit trainer.lora: missing {missing[:3]}, "
                         f"unexpected {extra[:3]}")
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(tensors[k].to(dtype=p.dtype))


def merged_state(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A full state dict with adapters (``X.weight``, ``X.lora_A.weight``, ``X.lora_B.weight``) ->
    the base model's state dict with ``X.weight + B @ A * scaling`` (float32 arithmetic)."""
    out = {k: v for k, v in state.items() if not is_lora_key(k)}
    for k in state:
        if k.endswith(".lora_A.weight"):
            module = k[: -len(".lora_A.weight")]
            a, b = state[k].float(), state[f"{module}.lora_B.weight"].float()
            w = out[f"{module}.weight"]
            out[f"{module}.weight"] = (w.float() + (b @ a) * scaling).to(w.dtype)
    return out


class Policy:
    """What the trainer does differently with ``trainer.lora``: build, publish, checkpoint, export."""

    def __init__(self, cfg, base: str):
        self.cfg, self.base = cfg, base
        self.config = adapter_config(cfg.rank, cfg.alpha, cfg.dropout, cfg.target_modules, base)
        self.modules: list[str] = []

    @property
    def scaling(self) -> float:
        return self.cfg.alpha / self.cfg.rank

    def prepare(self, ckpt: Path | None):
        """For ``load_model``: wrap the target layers (before sharding), and load the checkpoint's adapter."""

        def fn(model):
            self.modules = inject(model, self.cfg.rank, self.cfg.alpha, self.cfg.dropout, self.cfg.target_modules)
            if ckpt is not None:
                load_into(model, read_adapter(ckpt / "adapter")[1])

        return fn

    def describe(self, model) -> str:
        n = sum(p.numel() for n, p in model.named_parameters() if is_lora_key(n))
        return (f"LoRA rank {self.cfg.rank} alpha {self.cfg.alpha:g} on {len(self.modules)} layers "
                f"({', '.join(self.cfg.target_modules)}): {n / 1e6:.2f}M trained parameters")

    def publish(self, root: Path, step: int, model, dtype: torch.dtype, keep: int, rank: int) -> Path:
        """Collective: ``root/step-N/`` with the adapter in PEFT's files, ``READY`` last (rank 0 writes)."""
        from slurmrl.runtime.trainer.state import _swap_in, prune

        tensors = adapter_tensors(model)
        final = root / step_name(step)
        if rank == 0:
            tmp = root / f".{step_name(step)}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            write_adapter(tmp, tensors, self.config, dtype)
            _swap_in(tmp, final)
            (final / "READY").write_text(f"{step}\n")
            prune(root, "READY", keep)
        return final

    def checkpoint_writer(self, model):
        """Collective (gathers the adapter on every rank); returns what rank 0 writes into a checkpoint."""
        tensors = adapter_tensors(model)
        return lambda tmp: write_adapter(tmp / "adapter", tensors, self.config, torch.float32)

    def export(self, out: Path, model, config, generation_config, tokenizer_src, tokenizer, dtype: torch.dtype,
               rank: int) -> Path:
        """Collective: the merged model as a plain HF folder at ``out`` (built aside, renamed into place)."""
        from slurmrl.runtime.trainer.state import _swap_in, full_model_state, write_hf_folder

        state = full_model_state(model)
        if rank == 0:
            tmp = out.parent / f".{out.name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            write_hf_folder(tmp, merged_state(state, self.scaling), config, generation_config, tokenizer_src,
                            tokenizer, dtype)
            _swap_in(tmp, out)
        del state
        return out


def merge(base: str, adapter: Path, out: Path, dtype: str = "float32") -> Path:
    """Base model folder (or hub id) + adapter folder -> merged plain HF folder ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slurmrl.runtime.trainer.state import write_hf_folder

    cfg, tensors = read_adapter(adapter)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    inject(model, cfg["r"], cfg["lora_alpha"], 0.0, cfg["target_modules"])
    load_into(model, tensors)
    state = model.state_dict()  # write_hf_folder copies every tensor and gives the LM head its own
    src = Path(base) if Path(base).is_dir() else None
    tok = AutoTokenizer.from_pretrained(base) if src is None else None
    write_hf_folder(out, merged_state(state, cfg["lora_alpha"] / cfg["r"]), model.config,
                    getattr(model, "generation_config", None), src, tok, getattr(torch, dtype))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Merge a LoRA adapter (PEFT files) into its base model.")
    sub = ap.add_subparsers(dest="action", required=True)
    m = sub.add_parser("merge", help="write BASE + ADAPTER as a plain HF model folder OUT")
    m.add_argument("base", help="base model folder or hub id")
    m.add_argument("adapter", type=Path, help="folder with adapter_config.json and adapter_model.safetensors")
    m.add_argument("out", type=Path)
    m.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    args = ap.parse_args(argv)
    for f in (CONFIG, WEIGHTS):
        if not (args.adapter / f).is_file():
            print(f"slurmrl: lora merge: {args.adapter / f} is missing", file=sys.stderr)
            return 2
    print(merge(args.base, args.adapter, args.out, args.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
