"""One training step of a tiny model, on one rank and split over ranks (gloo, spawned processes): a
test helper for context and expert parallelism. ``reference`` is the single-rank step; ``worker``
runs the split step on its rank and writes its summed loss and gradients for the test to compare."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from moe_families import config as moe_config

from slurmrl.runtime.trainer.packing import PackedRow, pack_documents
from slurmrl.runtime.trainer.token_forward import FastPath, logprobs

DOCS = (7, 12, 10)  # a packed row of three documents, 29 tokens: an odd length, padded to split


def tiny(kind: str, kv_heads: int = 2):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    if kind == "dense":
        cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=kv_heads, head_dim=8, vocab_size=64, tie_word_embeddings=False)
    else:
        cfg = moe_config(kind, experts=8, top_k=2)
    # float64 where every kernel has it; transformers' grouped-GEMM experts take float32 at most
    model = AutoModelForCausalLM.from_config(cfg).to(torch.float64 if kind == "dense" else torch.float32)
    return model, FastPath.prepare(model)


def row() -> PackedRow:
    g = torch.Generator().manual_seed(1)
    docs = [(torch.randint(0, 64, (n,), generator=g).tolist(), [True] * n) for n in DOCS]
    weights = [torch.rand(n, generator=g, dtype=torch.float64).tolist() for n in DOCS]  # a per-token loss weight
    return pack_documents(docs, {"w": weights})


def loss_of(model, fast, r) -> torch.Tensor:
    logp, _ = logprobs(model, r, torch.device("cpu"), fast)
    return -(logp.double() * r.at_targets("w", torch.device("cpu")).double()).sum()


def reference(kind: str, kv_heads: int = 2) -> tuple[float, dict[str, torch.Tensor]]:
    model, fast = tiny(kind, kv_heads)
    loss = loss_of(model, fast, row())
    loss.backward()
    return float(loss), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def worker(rank: int, world: int, cases: list[tuple[str, int]], out: str, split: str) -> None:
    """Each case (model kind, KV heads) split over the ranks; rank 0 writes ``out/<kind>-<kv>.pt``.
    The ranks meet through a file in ``out`` (no port to race for on a shared machine)."""
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world)
    try:
        for kind, kv_heads in cases:
            step(rank, world, kind, kv_heads, Path(out) / f"{kind}-{kv_heads}.pt", split)
    finally:
        dist.destroy_process_group()


def step(rank: int, world: int, kind: str, kv_heads: int, out: Path, split: str) -> None:
    model, fast = tiny(kind, kv_heads)
    if split == "cp":
        from slurmrl.runtime.trainer import context_parallel

        context_parallel.install(model, dist.group.WORLD)
        loss = loss_of(model, fast, context_parallel.shard(row(), rank, world))
    else:
        raise ValueError(split)
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    grads = {}
    for n, p in model.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        dist.all_reduce(g)
        grads[n] = g
    if rank == 0:
        torch.save({"loss": float(total), "grads": grads}, out)
