"""A step split over 2 spawned ranks (gloo on CPU) equals the single-rank step, loss and every gradient:

- context parallel (Ulysses), cp=2: one packed row of three documents (an odd length: padded to
  split) over both ranks, for a tiny dense model (GQA, and one KV head: repeated across ranks) and
  tiny Qwen3-MoE / GLM-4-MoE models (float64 where every kernel has it, else float32);
- expert parallel, ep=2: each rank its own row, the experts split, tokens exchanged by all-to-all,
  grouped GEMMs; against one rank taking both rows, for Qwen3-MoE, GLM-4-MoE (sigmoid router, shared
  expert), Mixtral and DeepSeek-V3, the loss including the router's load-balance loss where the model
  defines one (Qwen3-MoE, Mixtral); the gathered state dict is the unsharded model's.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import parallel_step  # noqa: E402

from slurmrl.runtime.trainer import context_parallel  # noqa: E402

CASES = {"cp": [("dense", 2), ("dense", 1), ("qwen3_moe", 2), ("glm4_moe", 2)],
         "ep": [("qwen3_moe", 2), ("glm4_moe", 2), ("mixtral", 2), ("deepseek_v3", 2)]}


@pytest.fixture(scope="module")
def stepped(tmp_path_factory):
    """split -> the folder with its cases' results: each split's cases in one set of spawned ranks."""
    done = {}

    def get(split: str):
        if split not in done:
            done[split] = parallel_step.spawned(tmp_path_factory.mktemp(split), split, CASES[split])
        return done[split]

    return get


@pytest.mark.slow  # two spawned ranks import transformers: ~50 s for the nine cases
@pytest.mark.parametrize("split, kind, kv_heads", [(s, k, h) for s, cases in CASES.items() for k, h in cases])
def test_a_split_step_equals_the_single_rank_step(stepped, split, kind, kv_heads):
    ep = split == "ep"  # each ep rank its own row, with the router's load-balance loss (Qwen3-MoE, Mixtral)
    loss, grads = parallel_step.reference(kind, kv_heads, rows=2 if ep else 1, aux=ep)
    rtol, atol = (1e-10, 1e-12) if kind == "dense" else (1e-5, 1e-6)  # float64, float32
    got = parallel_step.assert_same_step(stepped(split) / f"{kind}-{kv_heads}.pt", loss, grads, rtol, atol)
    if ep:
        assert any(".experts." in n for n in grads)
        assert got["state_equal"], "full_state() gathers the unsharded model's state dict"


def test_a_row_splits_into_equal_slices_that_keep_every_target_once():
    row = parallel_step.row()
    slices = [context_parallel.shard(row, r, 4) for r in range(4)]
    assert {s.tokens for s in slices} == {8}  # 29 tokens + 3 of padding
    assert slices[-1].cu_seqlens.tolist() == [0, 7, 19, 29, 32]  # the padding: a document of its own
    index, nxt = row.selection(torch.device("cpu"))
    parts = [s.selection(torch.device("cpu")) for s in slices]
    assert torch.equal(torch.cat([i + s.start for (i, _), s in zip(parts, slices)]), index)
    assert torch.equal(torch.cat([n for _, n in parts]), nxt)
