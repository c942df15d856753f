"""One training step of a tiny model, on one rank and split over ranks (gloo, spawned processes): a
test helper for context and expert parallelism. ``reference`` is the single-rank step; ``worker``
runs the split step on its rank and writes its summed loss and gradients for the test to compare."""

from __future__ import annotations

import os
import sys
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


def row(seed: int = 1) -> PackedRow:
    g = torch.Generator().manual_seed(seed)
    docs = [(torch.randint(0, 64, (n,), generator=g).tolist(), [True] * n) for n in DOCS]
    weights = [torch.rand(n, generator=g, dtype=torch.float64).tolist() for n in DOCS]  # a per-token loss weight
    return pack_documents(docs, {"w": weights})


def loss_of(model, fast, r, aux: bool = False) -> torch.Tensor:
    """The weighted token loss; ``aux``: plus the router's load-balance loss as the model defines it
    (``router_aux_loss_coef`` x its ``aux_loss``, from a second forward with router logits)."""
    logp, _ = logprobs(model, r, torch.device("cpu"), fast)
    loss = -(logp.double() * r.at_targets("w", torch.device("cpu")).double()).sum()
    if aux and getattr(model.config, "router_aux_loss_coef", 0):
        out = model(input_ids=r.input_ids, position_ids=r.position_ids, output_router_logits=True,
                    **r.attention_kwargs(torch.device("cpu")))
        if getattr(out, "aux_loss", None) is not None:  # GLM-4-MoE, DeepSeek-V3: a bias, no aux loss
            loss = loss + model.config.router_aux_loss_coef * out.aux_loss.double()
    return loss


def reference(kind: str, kv_heads: int = 2, rows: int = 1, aux: bool = False) -> tuple[float, dict[str, torch.Tensor]]:
    """One rank's step over ``rows`` rows (the rows that ``rows`` data-parallel ranks would take);
    ``aux``: each row's loss with the router's load-balance loss."""
    model, fast = tiny(kind, kv_heads)
    total = 0.0
    for r in range(rows):
        loss = loss_of(model, fast, row(1 + r), aux)
        loss.backward()
        total += float(loss.detach())
    return total, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def worker(rank: int, world: int, cases: list[tuple[str, int]], out: str, split: str) -> None:
    """Each case (model kind, KV heads) split over the ranks; rank 0 writes ``out/<kind>-<kv>.pt``.
    The ranks meet through a file in ``out`` (no port to race for on a shared machine); each rank's
    stderr goes to ``out/rank-N.log`` (``spawned`` shows it when a rank fails)."""
    log = open(Path(out) / f"rank-{rank}.log", "w")  # noqa: SIM115 (open for the process's life)
    os.dup2(log.fileno(), 2)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world)
    for kind, kv_heads in cases:
        step(rank, world, kind, kv_heads, Path(out) / f"{kind}-{kv_heads}.pt", split)
    dist.barrier()  # both ranks done before either tears its group down
    dist.destroy_process_group()
    # results are on disk: skip the interpreter's teardown, where gloo's threads were seen to abort
    # the process now and then ("terminate called without an active exception")
    sys.stderr.flush()
    os._exit(0)


def step(rank: int, world: int, kind: str, kv_heads: int, out: Path, split: str) -> None:
    model, fast = tiny(kind, kv_heads)
    if split in ("cp", "ring"):  # cp: the style install picks by the heads (Ulysses where they divide)
        from slurmrl.runtime.trainer import context_parallel

        style = context_parallel.install(model, dist.group.WORLD, "ring" if split == "ring" else None)
        assert style == ("ring" if split == "ring" or model.config.num_attention_heads % world else "ulysses")
        loss = loss_of(model, fast, context_parallel.shard(row(), rank, world, style=style))
    elif split == "ep":  # data parallel with experts split: rank r takes row r, experts go where they live
        from slurmrl.runtime.trainer import expert_parallel

        assert expert_parallel.shard(model, dist.group.WORLD) > 0
        loss = loss_of(model, fast, row(1 + rank), aux=True)
    elif split == "ep_fsdp":
        return ep_fsdp_step(rank, world, model, fast, out)
    else:
        raise ValueError(split)
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    grads = {}
    for n, p in model.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        if split == "ep" and n.endswith((".gate_up_proj", ".down_proj")) and ".experts." in n:
            parts = [torch.empty_like(g) for _ in range(world)]  # each rank's experts: their whole gradient
            dist.all_gather(parts, g.contiguous())
            g = torch.cat(parts)
        else:
            dist.all_reduce(g)
        grads[n] = g
    state_equal = None
    if split == "ep":
        from slurmrl.runtime.trainer import expert_parallel

        whole, _ = tiny(kind, kv_heads)
        state = expert_parallel.full_state(model, dist.group.WORLD)
        ref = whole.state_dict()
        state_equal = state.keys() == ref.keys() and all(torch.equal(state[n], ref[n]) for n in ref)
    if rank == 0:
        torch.save({"loss": float(total), "grads": grads, "state_equal": state_equal}, out)


def ep_fsdp_step(rank: int, world: int, model, fast, out: Path) -> None:
    """The trainer loop's way (``mesh.TrainerMesh``, ``mesh_apply``): experts split over ep = 2 ranks,
    ``world / 2`` replicas of each slice, FSDP2 over every rank for the rest; rank r's loss on row r
    scaled by ``world`` as the loop scales it. Rank 0 writes the summed loss, the gradients made whole
    and the grad norm."""
    from slurmrl.runtime.trainer import numerics
    from slurmrl.runtime.trainer.mesh import TrainerMesh
    from slurmrl.settings.trainer import Parallel

    mesh = TrainerMesh(Parallel(ep=2), world, rank)
    mesh.connect()
    experts = mesh.experts
    assert experts is not None
    numerics.shard(model, mesh.fsdp("cpu"), False, experts.apply(model))
    loss = loss_of(model, fast, row(1 + rank))
    (loss * world).backward()
    norm = experts.grad_norm_and_clip(model, 1e9)  # no clipping: the norm alone
    total = loss.detach().clone()
    dist.all_reduce(total)
    grads = {n: experts.gather(p.grad) if experts.is_slice(p) else p.grad.full_tensor()
             for n, p in model.named_parameters() if p.grad is not None}
    if rank == 0:
        torch.save({"loss": float(total), "grads": grads, "norm": norm}, out)


def spawned(out: Path, split: str, cases: list[tuple[str, int]], world: int = 2) -> Path:
    """Every case's split step, in one set of ``world`` spawned ranks (each start imports transformers)."""
    import torch.multiprocessing as mp

    try:
        mp.spawn(worker, args=(world, cases, str(out), split), nprocs=world)
    except Exception as e:
        logs = "\n".join(f"--- rank {r}:\n" + (out / f"rank-{r}.log").read_text()[-3000:] for r in range(world))
        raise AssertionError(f"a rank failed: {e}\n{logs}") from None
    return out


def assert_same_step(got_file: Path, loss: float, grads: dict[str, torch.Tensor], rtol: float, atol: float) -> dict:
    """The split step's summed loss and gathered gradients against the single-rank step's."""
    got = torch.load(got_file)
    assert abs(got["loss"] - loss) <= rtol * abs(loss), (got["loss"], loss)
    assert set(got["grads"]) == set(grads)
    for name, g in grads.items():
        assert got["grads"][name].shape == g.shape, name
        assert torch.allclose(got["grads"][name], g, rtol=100 * rtol, atol=atol), name
    return got
