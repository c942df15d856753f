"""Context parallelism (Ulysses, gloo on CPU, 2 spawned ranks): the loss and every gradient of a cp=2
step on a packed row of three documents (an odd length: padded to split) equal the single-rank step,
for a tiny dense model (GQA, and one KV head: repeated across ranks) and tiny MoE models."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
mp = pytest.importorskip("torch.multiprocessing")

import parallel_step  # noqa: E402

from slurmrl.runtime.trainer import context_parallel  # noqa: E402

CASES = [("dense", 2), ("dense", 1), ("qwen3_moe", 2), ("glm4_moe", 2)]


@pytest.fixture(scope="module")
def cp2(tmp_path_factory):
    """Every case's cp=2 step, in one pair of spawned ranks (each start imports transformers)."""
    out = tmp_path_factory.mktemp("cp2")
    mp.spawn(parallel_step.worker, args=(2, CASES, str(out), "cp"), nprocs=2)
    return out


@pytest.mark.parametrize("kind, kv_heads", CASES)
def test_a_cp2_step_equals_the_single_rank_step(cp2, kind, kv_heads):
    loss, grads = parallel_step.reference(kind, kv_heads)
    got = torch.load(cp2 / f"{kind}-{kv_heads}.pt")
    rtol, atol = (1e-10, 1e-12) if kind == "dense" else (1e-5, 1e-6)  # float64, float32
    assert got["loss"] == pytest.approx(loss, rel=rtol)
    assert set(got["grads"]) == set(grads)
    for name, g in grads.items():
        assert torch.allclose(got["grads"][name], g, rtol=100 * rtol, atol=atol), name


def test_a_row_splits_into_equal_slices_that_keep_every_target_once():
    row = parallel_step.row()
    slices = [context_parallel.shard(row, r, 4) for r in range(4)]
    assert {s.tokens for s in slices} == {8}  # 29 tokens + 3 of padding
    assert slices[-1].cu_seqlens.tolist() == [0, 7, 19, 29, 32]  # the padding: a document of its own
    index, nxt = row.selection(torch.device("cpu"))
    parts = [s.selection(torch.device("cpu")) for s in slices]
    assert torch.equal(torch.cat([i + s.start for (i, _), s in zip(parts, slices)]), index)
    assert torch.equal(torch.cat([n for _, n in parts]), nxt)
