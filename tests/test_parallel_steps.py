"""A step split over 2 spawned ranks (gloo on CPU) equals the single-rank step, loss and every gradient:

- context parallel (Ulysses), cp=2: one packed row of three documents (an odd length: padded to
  split) over both ranks, for a tiny dense model (GQA, and one KV head: repeated across ranks) and
  tiny Qwen3-MoE / GLM-4-MoE models (float64 where every kernel has it, else float32);
- context parallel, ring attention, cp=2 (asked for) and cp=3 (the default where 3 does not divide the
  model's 4 query heads: Ulysses cannot split them): the same row in zigzag chunks (29 tokens padded to
  30 for cp=3), GQA and one KV head (float64), Qwen3-MoE / GLM-4-MoE (float32), K/V passed round the
  ranks by send/recv;
- expert parallel, ep=2: each rank its own row, the experts split, tokens exchanged by all-to-all,
  grouped GEMMs; against one rank taking both rows, for Qwen3-MoE, GLM-4-MoE (sigmoid router, shared
  expert), Mixtral and DeepSeek-V3, the loss including the router's load-balance loss where the model
  defines one (Qwen3-MoE, Mixtral); the gathered state dict is the unsharded model's;
- the trainer loop's expert mesh (``mesh_apply``) on 4 ranks: ep = 2 with two replicas of each expert
  slice and FSDP2 over all four for the rest; the loss, every gradient and the grad norm equal one rank
  taking the four rows (each expert counted once).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import parallel_step  # noqa: E402

from slurmrl.runtime.trainer import context_parallel  # noqa: E402

CASES = {"cp": [("dense", 2), ("dense", 1), ("qwen3_moe", 2), ("glm4_moe", 2)],
         "ring": [("dense", 2), ("dense", 1), ("qwen3_moe", 2), ("glm4_moe", 2)],
         "cp3": [("dense", 2), ("dense", 1)],  # no style asked: ring, as 3 does not divide 4 heads
         "ep": [("qwen3_moe", 2), ("glm4_moe", 2), ("mixtral", 2), ("deepseek_v3", 2)]}


@pytest.fixture(scope="module")
def stepped(tmp_path_factory):
    """split -> the folder with its cases' results: each split's cases in one set of spawned ranks."""
    done = {}

    def get(split: str):
        if split not in done:
            world = 3 if split == "cp3" else 2
            done[split] = parallel_step.spawned(tmp_path_factory.mktemp(split), split.rstrip("3"), CASES[split], world)
        return done[split]

    return get


@pytest.mark.slow  # spawned ranks import transformers: ~50 s for the nine cp and ep cases, ~50 s for ring
@pytest.mark.parametrize("split, kind, kv_heads", [(s, k, h) for s, cases in CASES.items() for k, h in cases])
def test_a_split_step_equals_the_single_rank_step(stepped, split, kind, kv_heads):
    ep = split == "ep"  # each ep rank its own row, with the router's load-balance loss (Qwen3-MoE, Mixtral)
    loss, grads = parallel_step.reference(kind, kv_heads, rows=2 if ep else 1, aux=ep)
    rtol, atol = (1e-10, 1e-12) if kind == "dense" else (1e-5, 1e-6)  # float64, float32
    got = parallel_step.assert_same_step(stepped(split) / f"{kind}-{kv_heads}.pt", loss, grads, rtol, atol)
    if ep:
        assert any(".experts." in n for n in grads)
        assert got["state_equal"], "full_state() gathers the unsharded model's state dict"


@pytest.mark.parametrize("style, cp, size, cu", [
    ("ulysses", 4, 8, [0, 7, 19, 29, 32]),  # 29 tokens + 3 of padding, a document of its own
    ("ring", 4, 8, [0, 7, 19, 29, 32]),  # 2 x 4 chunks of 4
    ("ring", 3, 10, [0, 7, 19, 29, 30]),  # 29 tokens + 1: 2 x 3 chunks of 5
])
def test_a_row_splits_into_equal_slices_that_keep_every_target_once(style, cp, size, cu):
    row = parallel_step.row()
    slices = [context_parallel.shard(row, r, cp, style=style) for r in range(cp)]
    assert {s.tokens for s in slices} == {size}
    assert slices[-1].cu_seqlens.tolist() == cu
    held = torch.cat([s.positions() for s in slices]).sort().values
    assert torch.equal(held, torch.arange(cu[-1]))  # every token on exactly one rank
    if style == "ring":  # zigzag: rank r holds chunks r and 2 cp - 1 - r
        c = cu[-1] // (2 * cp)
        assert slices[0].spans == ((0, c), ((2 * cp - 1) * c, 2 * cp * c))
    index, nxt = row.selection(torch.device("cpu"))
    got = sorted((int(s.positions()[i]), int(n)) for s in slices for i, n in zip(*s.selection(torch.device("cpu"))))
    assert got == list(zip(index.tolist(), nxt.tolist()))  # each target once, with its own next token
    for s in slices:  # a rank's ids and positions are the row's at its positions
        real = s.positions() < row.tokens
        assert torch.equal(s.input_ids[0][real], row.input_ids[0, s.positions()[real]])


def test_ring_attention_refuses_a_sliding_window_shorter_than_a_document_and_attention_sinks():
    q = torch.zeros(1, 4, 8, 8)
    cu = torch.tensor([0, 3, 16], dtype=torch.int32)  # documents of 3 and 13 tokens
    with pytest.raises(RuntimeError, match="no sliding window or attention sinks"):
        context_parallel.ring_attend(None, q, q, q, None, sliding_window=8, cu_seq_lens_q=cu)
    with pytest.raises(RuntimeError, match="no sliding window or attention sinks"):
        context_parallel.ring_attend(None, q, q, q, None, s_aux=torch.zeros(4), cu_seq_lens_q=cu)
    with pytest.raises(RuntimeError, match="document bounds"):
        context_parallel.ring_attend(None, q, q, q, None)


def test_the_trainer_picks_ulysses_where_the_heads_divide_else_ring_and_refuses_ulysses_where_they_do_not():
    assert context_parallel.style_of(8, 4, None) == "ulysses" and context_parallel.style_of(8, 3, None) == "ring"
    assert context_parallel.style_of(8, 4, "ring") == "ring"
    with pytest.raises(ValueError, match="trainer.parallel.cp_style: ulysses: cp 3 does not divide the model's 8 attention "
                       'heads .*; set cp_style = "ring"'):
        context_parallel.style_of(8, 3, "ulysses")


@pytest.mark.slow  # four spawned ranks import transformers: ~40 s
@pytest.mark.parametrize("kind", ["qwen3_moe"])
def test_the_loops_expert_mesh_with_replicas_equals_the_single_rank_step(tmp_path, kind):
    got_file = parallel_step.spawned(tmp_path, "ep_fsdp", [(kind, 2)], world=4) / f"{kind}-2.pt"
    loss, grads = parallel_step.reference(kind, 2, rows=4)
    got = parallel_step.assert_same_step(got_file, loss, grads, 1e-5, 1e-6)
    assert any(".experts." in n for n in grads)
    norm = float(torch.sqrt(sum(g.double().pow(2).sum() for g in grads.values())))
    assert got["norm"] == pytest.approx(norm, rel=1e-5), (got["norm"], norm)
