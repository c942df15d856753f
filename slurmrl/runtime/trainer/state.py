"""Weights for the inference servers and resumable checkpoints, on a shared filesystem.

Both are folders named ``step-NNNNNN``, built under ``.step-NNNNNN.tmp`` (a dot name: globs for
``step-*`` never see it) and renamed into place, with a marker file (``READY`` for weights,
``DONE`` for checkpoints). A folder without its marker is incomplete and ignored. Checkpoints:
every rank takes part in gathering the full state dicts (FSDP2), rank 0 writes them, every rank
its RNG state; ``DONE`` is written inside the temporary folder once every rank's part is synced,
so one rename makes the checkpoint visible whole (``commit``). Weights: ``publish`` (every rank
writes its own shard, beside the next step).
"""

from __future__ import annotations

import copy
import json
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from slurmrl.runtime.step_files import STEP_DIR, complete_steps, step_name
from slurmrl.runtime.trainer import commit
from slurmrl.runtime.trainer.stage import Stager, copy_part

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "tokenizer.model", "vocab.txt", "chat_template.jinja", "chat_template.json",
)
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def prune(root: Path, marker: str, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete folders (never the newest), and stale temporaries."""
    done = complete_steps(root, marker)
    gone = [d for _, d in done[: max(0, len(done) - max(1, keep))]]
    gone += [d for d in root.glob(".step-*.tmp")] if root.is_dir() else []
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    return gone


def drop_after(root: Path, step: int) -> list[Path]:
    """Delete step folders newer than ``step`` (complete or not) and temporaries: after a resume
    they belong to steps that are redone, and must not be taken for the new ones."""
    gone = []
    if root.is_dir():
        for d in root.iterdir():
            m = STEP_DIR.match(d.name)
            if (m and int(m.group(1)) > step) or (d.name.startswith(".step-") and d.name.endswith(".tmp")):
                shutil.rmtree(d, ignore_errors=True)
                gone.append(d)
    return sorted(gone)


def full_model_state(model) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict on rank 0's CPU; empty on other ranks. Collective."""
    return get_model_state_dict(model, options=FULL)


def write_hf_folder(out: Path, state: dict[str, torch.Tensor], config, generation_config, tokenizer_src: Path | None,
                    tokenizer, dtype: torch.dtype) -> None:
    """config.json (untied embeddings), safetensors shards, tokenizer files."""
    from huggingface_hub import save_torch_state_dict

    out.mkdir(parents=True, exist_ok=True)
    # own copies: gathered tensors may be views into one flat buffer, which safetensors refuses
    tensors = {k: v.detach().to(dtype=dtype, copy=True).contiguous() for k, v in state.items()}
    emb = next((k for k in tensors if k.endswith("embed_tokens.weight")), None)
    if "lm_head.weight" not in tensors and emb is not None:  # an inference engine must see its own LM head
        tensors["lm_head.weight"] = tensors[emb].clone()
    config = copy.deepcopy(config)
    config.tie_word_embeddings = False
    config.dtype = dtype
    config.save_pretrained(out)
    if generation_config is not None:
        generation_config.save_pretrained(out)
    save_torch_state_dict(tensors, out, metadata={"format": "pt"})
    copied = False
    if tokenizer_src is not None and tokenizer_src.is_dir():
        for name in TOKENIZER_FILES:
            if (tokenizer_src / name).exists():
                shutil.copy2(tokenizer_src / name, out / name)
                copied = True
    if not copied and tokenizer is not None:
        tokenizer.save_pretrained(out)


_swap_in = commit.swap_in  # weights too: publish, lora


def mark_broadcast(root: Path, step: int, keep: int) -> Path:
    """Rank 0, after every server took the weights of ``step`` by broadcast: ``root/step-N/READY``
    with no weights beside it (what the orchestrator waits for, as for published weights)."""
    final = root / step_name(step)
    final.mkdir(parents=True, exist_ok=True)
    (final / "READY").write_text(f"{step} broadcast\n")
    prune(root, "READY", keep)
    return final


def rng_state() -> dict:
    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state()
    return st


def set_rng_state(st: dict) -> None:
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(st["cuda"])


def save_checkpoint(root: Path, step: int, model, optimizer, config, generation_config, tokenizer_src, tokenizer,
                    extra: dict, keep: int, rank: int, write_model=None, experts=None, group=None,
                    grace_s: float | None = None, stage: Stager | None = None) -> Path:
    """Collective. ``model/`` (float32 HF folder), ``optimizer.pt``, ``state.json``, ``rng-rank<R>.pt``,
    written under a temporary name and made visible whole with ``DONE`` (``commit``: every rank's
    part synced first; ``group``: ``commit.group``, ``grace_s``: the time after a stop it may take,
    else it is dropped whole and ``commit.Dropped`` raised on rank 0).
    ``write_model(tmp)``, when given, writes what the checkpoint keeps of the model instead of
    ``model/`` (a LoRA policy: its adapter; see lora.Policy.checkpoint_writer). ``experts``
    (``mesh_apply.ExpertMesh``): the expert slices and their AdamW moments gathered whole, so the
    checkpoint is the one an unsplit run writes. ``stage`` (trainer.checkpoint_stage_dir): each rank
    writes its part node-locally and the copy, sync and rename run in the background
    (slurmrl.runtime.trainer.stage): the folder returned is visible once ``stage.wait()`` returns."""
    final = root / step_name(step)
    tmp = root / f".{step_name(step)}.tmp"
    model_state = full_model_state(model) if write_model is None else None
    optim_state = get_optimizer_state_dict(model, optimizer, options=FULL)
    if experts is not None:
        assert model_state is not None, "expert parallelism runs without a LoRA policy"
        model_state = experts.full_state(model, model_state, rank)
        optim_state = experts.full_optimizer(model, optimizer, optim_state, rank)
    here = tmp if stage is None else stage.folder(tmp.name)  # the copy in flight is done first
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()  # the folder exists before any rank writes into it
    if rank == 0:
        _write_main(here, step, model_state, optim_state, config, generation_config, tokenizer_src, tokenizer,
                    extra, write_model)
    del model_state, optim_state
    mine = [here / f"rng-rank{dist.get_rank()}.pt"]
    torch.save(rng_state(), mine[0])
    commit.test_pause()
    world = dist.get_world_size()
    if stage is not None:
        def copy_and_commit() -> None:
            try:
                copied = copy_part(here, tmp, grace_s)
            except commit.Dropped as e:
                if rank == 0:
                    shutil.rmtree(tmp, ignore_errors=True)
                raise commit.Dropped(f"checkpoint of step {step} dropped whole: {e}") from None
            commit.fsync_tree(tmp, None if rank == 0 else copied)
            _commit(tmp, final, step, rank, world, group, grace_s, keep)
            shutil.rmtree(here, ignore_errors=True)

        stage.start(f"checkpoint of step {step}", copy_and_commit)
        return final
    commit.fsync_tree(tmp, None if rank == 0 else mine)
    _commit(tmp, final, step, rank, world, group, grace_s, keep)
    dist.barrier()
    return final


def _commit(tmp: Path, final: Path, step: int, rank: int, world: int, group, grace_s: float | None, keep: int) -> None:
    """Every rank's part synced: rank 0 makes it visible (or drops it whole, ``commit.Dropped``)."""
    why = commit.peers_synced(group, rank, world, grace_s)
    if rank == 0:
        if why is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            raise commit.Dropped(f"checkpoint of step {step} dropped whole: {why}")
        commit.publish(tmp, final, step)
        prune(final.parent, commit.MARKER, keep)


def _write_main(tmp: Path, step: int, model_state, optim_state, config, generation_config, tokenizer_src,
                tokenizer, extra: dict, write_model) -> None:
    """Rank 0's part of a checkpoint: the model (or what ``write_model`` keeps of it), the
    optimizer, state.json."""
    if write_model is not None:
        write_model(tmp)
    else:
        assert model_state is not None, "gathered when there is no write_model"
        write_hf_folder(tmp / "model", model_state, config, generation_config, tokenizer_src, tokenizer,
                        torch.float32)
    commit.test_pause()
    torch.save(optim_state, tmp / "optimizer.pt")
    commit.test_pause()
    (tmp / "state.json").write_text(json.dumps({"step": step, **extra}, indent=1) + "\n")


def load_optimizer(ckpt: Path, model, optimizer, rank: int, experts=None) -> None:
    """Collective: rank 0 reads the full optimizer state and it is scattered to the shards. With
    ``experts`` every rank reads it and keeps its expert slices' part (a broadcast from rank 0 would
    hand every rank the whole of each expert tensor)."""
    if experts is not None:
        full = experts.local_optimizer(model, torch.load(ckpt / "optimizer.pt", map_location="cpu",
                                                         weights_only=False))
        set_optimizer_state_dict(model, optimizer, optim_state_dict=full,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))
        return
    full = torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=False) if rank == 0 else {}
    set_optimizer_state_dict(
        model, optimizer, optim_state_dict=full,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=dist.get_world_size() > 1),
    )


def load_rng(ckpt: Path, rank: int) -> bool:
    path = ckpt / f"rng-rank{rank}.pt"
    if not path.exists():
        return False
    set_rng_state(torch.load(path, map_location="cpu", weights_only=False))
    return True
