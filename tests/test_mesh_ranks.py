"""The trainer's ``TrainerMesh`` (slurmrl/runtime/trainer/mesh.py): over every shape the mesh rules
accept, each rank's place (dp/cp ranks, expert slice, replica) and the rank lists its groups are made
from partition the world as the layout says; on 4 real gloo ranks the groups it builds hold those ranks
and reduce over them, for plain FSDP, HSDP, cp, ep and cp x ep; a mesh the rules refuse, or one the
loaded model cannot take, stops the trainer with one line naming the field."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from slurmrl.runtime.trainer.mesh import TrainerMesh  # noqa: E402
from slurmrl.settings.mesh import problem  # noqa: E402
from slurmrl.settings.trainer import Parallel  # noqa: E402


def partitions(lists: list[list[int]], world: int) -> bool:
    return sorted(r for ranks in lists for r in ranks) == list(range(world))


@settings(max_examples=300, deadline=None)
@given(world=st.integers(1, 48), rep=st.integers(1, 4), cp=st.integers(1, 8), ep=st.integers(1, 8))
def test_every_rank_has_one_place_in_each_dimension(world, rep, cp, ep):
    p = Parallel(dp_replicate=rep, cp=cp, ep=ep)
    if problem(p, world, 0) is not None:
        return
    meshes = [TrainerMesh(p, world, r) for r in range(world)]
    m0 = meshes[0]
    assert m0.dp_replicate * m0.dp_shard * m0.cp == world and m0.parallel.dp_shard == m0.dp_shard
    cps, eps, sets = m0.cp_ranks(), m0.ep_groups(), m0.replica_sets()
    assert partitions(cps, world) and all(len(g) == cp for g in cps)
    assert partitions(eps, world) and all(len(g) == ep for g in eps)
    assert sets == [] if world == ep else (partitions(sets, world) and len(sets) == ep)
    for g in eps:  # every expert slice once in each expert group
        assert all(len(set(g) & set(s)) == 1 for s in sets)
    size = 1
    for n in m0.fsdp_shape():
        size *= n
    assert size == world and m0.fsdp_shape()[0] == (rep if rep > 1 else world)
    for m in meshes:
        assert cps[m.dp_rank][m.cp_rank] == m.rank and 0 <= m.dp_rank < m.dp_world == world // cp
        assert eps[m.ep_replica][m.ep_rank] == m.rank
        assert not sets or m.rank in sets[m.ep_rank]
    # ranks that share a row (the same dp rank) are exactly one cp group
    by_dp: dict[int, list[int]] = {}
    for m in meshes:
        by_dp.setdefault(m.dp_rank, []).append(m.rank)
    assert sorted(by_dp.values()) == sorted(cps)


SHAPES = [dict(), dict(dp_replicate=2), dict(cp=2), dict(ep=2), dict(cp=2, ep=2), dict(ep=4), dict(cp=4)]


def ranks_of(group) -> list[int] | None:
    import torch.distributed as dist

    if group is None:
        return None
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total, group=group)  # the group works: it sums its own ranks
    ranks = dist.get_process_group_ranks(group)
    assert total.item() == sum(ranks)
    return ranks


def worker(rank: int, world: int, out: str) -> None:
    """Every shape's mesh on this rank; its groups' ranks to ``out/rank-N.json``."""
    import torch.distributed as dist

    log = open(Path(out) / f"rank-{rank}.log", "w")  # noqa: SIM115 (open for the process's life)
    os.dup2(log.fileno(), 2)
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world)
    got = []
    for shape in SHAPES:
        m = TrainerMesh.build(Parallel(**shape), world, rank, seq_len=64, lora=False)
        fsdp = m.fsdp("cpu")
        got.append({
            "cp": ranks_of(m.cp_group),
            "ep": ranks_of(m.experts.group) if m.experts else None,
            "replicas": ranks_of(m.experts.replicas) if m.experts else None,
            "fsdp": fsdp.mesh.tolist(),
            "shard": ranks_of(fsdp.get_group("shard")) if m.dp_replicate > 1 else None,
            "replicate": ranks_of(fsdp.get_group("replicate")) if m.dp_replicate > 1 else None,
        })
    (Path(out) / f"rank-{rank}.json").write_text(json.dumps(got))
    dist.barrier()
    dist.destroy_process_group()
    sys.stderr.flush()
    os._exit(0)  # results are on disk: skip gloo's teardown (see tests/support/parallel_step.py)


@pytest.mark.slow  # four spawned ranks import torch
def test_the_groups_each_rank_builds_hold_the_listed_ranks(tmp_path):
    import torch.multiprocessing as mp

    world = 4
    try:
        mp.spawn(worker, args=(world, str(tmp_path)), nprocs=world)
    except Exception as e:
        logs = "\n".join((tmp_path / f"rank-{r}.log").read_text()[-2000:] for r in range(world))
        raise AssertionError(f"a rank failed: {e}\n{logs}") from None
    for rank in range(world):
        got = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        for shape, g in zip(SHAPES, got, strict=True):
            m = TrainerMesh(Parallel(**shape), world, rank)
            assert g["cp"] == (m.cp_ranks()[m.dp_rank] if m.cp > 1 else None), shape
            assert g["ep"] == (m.ep_groups()[m.ep_replica] if m.ep > 1 else None), shape
            assert g["replicas"] == (m.replica_sets()[m.ep_rank] if m.ep > 1 and world > m.ep else None), shape
            if m.dp_replicate > 1:  # HSDP: copies of consecutive ranks, each sharded inside
                assert g["fsdp"] == [[0, 1], [2, 3]] and g["shard"] == [[0, 1], [2, 3]][rank // 2], shape
                assert g["replicate"] == [rank % 2, rank % 2 + 2], shape
            else:
                assert g["fsdp"] == [0, 1, 2, 3], shape


@pytest.mark.parametrize("shape, lora, field, words", [
    (dict(ep=3), False, "trainer.parallel.ep", "does not divide dp_shard 4"),
    (dict(ep=2), True, "trainer.parallel.ep", "LoRA"),
    (dict(dp_replicate=2, ep=2), False, "trainer.parallel.dp_replicate", "ep = 1"),
    (dict(cp=3), False, "trainer.parallel.cp", "does not divide the trainer's 4"),
])
def test_the_trainer_refuses_at_start_what_plan_refuses(shape, lora, field, words):
    """Before any group is made (so no process group is needed to see it)."""
    with pytest.raises(SystemExit) as e:
        TrainerMesh.build(Parallel(**shape), 4, 0, seq_len=64, lora=lora)
    assert str(e.value).startswith(f"slurmrl: trainer: {field}: ") and words in str(e.value)
    assert "\n" not in str(e.value)


def test_the_loaded_model_is_checked_against_the_mesh():
    """A hub id plan had no numbers for: the trainer reads them from the model it loaded."""
    pytest.importorskip("transformers")
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    small = dict(vocab_size=32, hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=6,
                 num_key_value_heads=2, head_dim=8)
    moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(**small, num_experts=6, num_experts_per_tok=2,
                                             moe_intermediate_size=8))
    dense = Qwen3ForCausalLM(Qwen3Config(**small))
    TrainerMesh(Parallel(ep=2), 4, 0, 64).check_model(moe)  # 6 experts over 2 ranks
    cases = [(moe, Parallel(ep=4), "trainer.parallel.ep", "6 routed experts (Qwen3MoeForCausalLM's config)"),
             (dense, Parallel(ep=2), "trainer.parallel.ep", "not a mixture-of-experts model"),
             (dense, Parallel(cp=4, cp_style="ulysses"), "trainer.parallel.cp_style", "6 attention heads")]
    for model, p, field, words in cases:
        with pytest.raises(SystemExit) as e:
            TrainerMesh(p, 4, 0, 64).check_model(model)
        assert str(e.value).startswith(f"slurmrl: trainer: {field}: ") and words in str(e.value), str(e.value)
