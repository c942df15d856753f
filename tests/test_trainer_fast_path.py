"""The trainer's fast path on CPU, on a tiny random Qwen3 (GQA, head_dim != hidden / heads):

- the chunked LM head + log-softmax gives the unchunked logprobs, entropies and gradients;
- a packed row through per-document attention gives the logits (and gradients) of its documents
  run one by one, and no dense [T, T] mask is built on the way;
- the RL metrics (entropy, KL) are the same through the chunked path as from full logits;
- RL micro-batches are packed without padding; the recompute policy; FSDP2 mixed precision on
  one rank. Tests that need CUDA carry the ``gpu`` marker and are skipped without a GPU.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from slurmrl.contract.rollouts import Sample
from slurmrl.runtime.trainer import (
    chunked_head,
    dist,
    doc_attention,
    losses,
    numerics,
    packing,
    rl_metrics,
    rollouts,
    token_forward,
)
from slurmrl.runtime.trainer.mesh import TrainerMesh
from slurmrl.settings.trainer import Parallel


def tiny_qwen3(vocab=97, layers=2, seed=0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).to(torch.float64)
    model.config.use_cache = False
    return model


def exact_logprobs(logits, targets):
    logits = logits.double()
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, -1)


# ---- 1. chunked LM head ------------------------------------------------------------------
@pytest.mark.parametrize("vocab_chunk,token_chunk", [(7, 5), (97, 64), (1000, 1000), (32, 3)])
def test_chunked_logprobs_entropy_and_gradients_equal_the_unchunked(vocab_chunk, token_chunk):
    torch.manual_seed(1)
    n, h, v = 29, 12, 97
    hidden = torch.randn(n, h, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(v, h, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, v, (n,))
    upstream = torch.randn(n, dtype=torch.float64)
    logp, ent = chunked_head.token_logprobs_entropy(hidden, weight, targets, vocab_chunk, token_chunk)
    gh, gw = torch.autograd.grad((logp * upstream).sum(), (hidden, weight))
    z = hidden @ weight.t()
    ref = exact_logprobs(z, targets)
    rh, rw = torch.autograd.grad((ref * upstream).sum(), (hidden, weight))
    p = torch.log_softmax(z.detach(), -1)
    torch.testing.assert_close(logp, ref.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, -(p.exp() * p).sum(-1), rtol=0, atol=1e-12)
    torch.testing.assert_close(gh, rh, rtol=0, atol=1e-12)
    torch.testing.assert_close(gw, rw, rtol=0, atol=1e-12)
    assert not ent.requires_grad


def test_chunked_logprobs_pass_torch_gradcheck():
    torch.manual_seed(2)
    hidden = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 10, 3, 4, 4, 7])
    assert torch.autograd.gradcheck(
        lambda h, w: chunked_head.token_logprobs_entropy(h, w, targets, 4, 4)[0], (hidden, weight))


def test_the_chunked_head_never_builds_full_vocabulary_logits(monkeypatch):
    """Every matmul in forward and backward is at most [token_chunk, vocab_chunk] wide."""
    torch.manual_seed(3)
    hidden = torch.randn(40, 8, requires_grad=True)
    weight = torch.randn(300, 8, requires_grad=True)
    targets = torch.randint(0, 300, (40,))
    widest = []
    real = torch.Tensor.__matmul__

    def spy(a, b):
        out = real(a, b)
        widest.append(out.numel())
        return out

    monkeypatch.setattr(torch.Tensor, "__matmul__", spy)
    logp, _ = chunked_head.token_logprobs_entropy(hidden, weight, targets, vocab_chunk=64, token_chunk=16)
    logp.sum().backward()
    monkeypatch.undo()
    assert widest and max(widest) <= max(16 * 64, 64 * 8, 16 * 8) < 40 * 300


def test_a_model_with_the_chunked_head_has_the_gradients_of_the_plain_one():
    plain, fast = tiny_qwen3(), tiny_qwen3()
    ids = torch.randint(0, 97, (1, 40))
    pos = torch.arange(40)[None]
    index = torch.arange(5, 39)
    nxt = ids[0, 1:][index]
    logits = plain(input_ids=ids, position_ids=pos).logits[0]
    (-exact_logprobs(logits.index_select(0, index), nxt).sum()).backward()
    chunked_head.install(fast)
    fast.lm_head.vocab_chunk, fast.lm_head.token_chunk = 10, 8
    fast.lm_head.select(index, nxt)
    out = fast(input_ids=ids, position_ids=pos).logits
    (-out[:, 0].sum()).backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), fast.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-11, msg=name)
    assert set(fast.state_dict()) == set(plain.state_dict())  # same keys: checkpoints and publishing unchanged
    assert fast(input_ids=ids, position_ids=pos).logits.shape == (1, 40, 97)  # unarmed: a linear layer


def test_a_micro_batch_without_targets_still_gives_every_parameter_a_gradient():
    """A rank short of samples trains on a masked copy; FSDP2 needs its backward to reach every
    parameter (zeros) as on the other ranks."""
    model = tiny_qwen3()
    fast = token_forward.FastPath.prepare(model)
    (row,) = rollouts.split([sample([1, 2, 3], [4, 5], 1.0)], rank=1, world=2, micro=1, seq_len=8)
    logp, ent = token_forward.logprobs(model, row, torch.device("cpu"), fast)
    assert logp.shape == ent.shape == (0,)
    logp.sum().backward()
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_soft_capped_heads_are_not_chunked():
    model = tiny_qwen3()
    model.config.final_logit_softcapping = 30.0
    assert "soft-capped" in chunked_head.supports(model)


# ---- 2. packing without dense masks ------------------------------------------------------
def test_a_packed_row_gives_the_logits_and_gradients_of_its_documents_alone():
    lens = [13, 1, 30, 7]
    g = torch.Generator().manual_seed(4)
    docs = [torch.randint(0, 97, (n,), generator=g).tolist() for n in lens]
    plain, packed = tiny_qwen3(), tiny_qwen3()
    assert doc_attention.install(packed)
    row = packing.pack_documents([(d, [True] * len(d)) for d in docs])
    assert row.cu_seqlens.tolist() == [0, 13, 14, 44, 51] and row.tokens == sum(lens)
    out = packed(input_ids=row.input_ids, position_ids=row.position_ids,
                 **row.attention_kwargs(torch.device("cpu"))).logits
    alone = [plain(input_ids=torch.tensor([d]), position_ids=torch.arange(len(d))[None]).logits for d in docs]
    torch.testing.assert_close(out, torch.cat(alone, dim=1), rtol=1e-10, atol=1e-10)
    (out ** 2).mean().backward()
    (torch.cat(alone, dim=1) ** 2).mean().backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), packed.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-8, atol=1e-10, msg=name)


def test_no_dense_mask_is_built_for_a_packed_row(monkeypatch):
    import transformers.masking_utils as mu

    def refuse(*a, **k):
        raise AssertionError("a dense mask was built")

    for name in ("sdpa_mask", "eager_mask", "flex_attention_mask"):
        monkeypatch.setattr(mu, name, refuse)
    seen = []
    real = doc_attention.attend

    def spy(module, query, key, value, attention_mask, **kw):
        seen.append((attention_mask, tuple(query.shape)))
        return real(module, query, key, value, attention_mask, **kw)

    model = tiny_qwen3()
    assert doc_attention.install(model)
    from transformers import AttentionInterface

    AttentionInterface.register(doc_attention.NAME, spy)
    try:
        row = packing.pack_documents([([1, 2, 3, 4] * 50, [True] * 200), ([5, 6] * 100, [True] * 200)])
        model(input_ids=row.input_ids, position_ids=row.position_ids,
              **row.attention_kwargs(torch.device("cpu"))).logits.sum().backward()
    finally:
        AttentionInterface.register(doc_attention.NAME, real)
    assert len(seen) == 2 and all(m is None for m, _ in seen)  # one call per layer, never a mask
    # and the per-document attention never forms a [T, T] score matrix: each call sees one document
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, *a, **k: calls.append(q.shape[2]) or sdpa(q, *a, **k))
    model(input_ids=row.input_ids, position_ids=row.position_ids, **row.attention_kwargs(torch.device("cpu")))
    assert calls and max(calls) == 200 < row.tokens


def test_sft_packs_lose_their_padding_and_keep_their_boundaries():
    from slurmrl.runtime.trainer.data import Example, pack

    exs = [Example([1, 2, 3], [0, 1, 1]), Example([4, 5, 6, 7], [1, 1, 1, 1]), Example([8, 9], [0, 1])]
    packs = pack(exs, [0, 1, 2], seq_len=8, pad_id=0)
    row = packing.pack_sft(packs)
    assert row.input_ids[0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert row.cu_seqlens.tolist() == [0, 3, 7, 9]
    index, nxt = row.selection(torch.device("cpu"))
    # targets: 2, 3 (ex 0), 5, 6, 7 (ex 1, not its first), 9 (ex 2); predicted from the token before
    assert nxt.tolist() == [2, 3, 5, 6, 7, 9] and index.tolist() == [0, 1, 3, 4, 5, 7]


def sample(p, c, adv, lp=None) -> Sample:
    return Sample(prompt_ids=tuple(p), completion_ids=tuple(c), advantage=adv, logprobs=tuple(lp or ()), reward=0.0)


def test_rl_micro_batches_are_packed_without_padding():
    samples = [sample([1, 2, 3], [4, 5], 1.0, [-0.5, -0.25]), sample([6], [7, 8, 9], -1.0),
               sample([1, 2], [3], 0.5, [-1.0])]
    rows = rollouts.split(samples, rank=0, world=1, micro=2, seq_len=4)
    assert [r.tokens for r in rows] == [4 + 4, 3]  # the first sample is cut to seq_len 4
    assert [r.cu_seqlens.tolist() for r in rows] == [[0, 4, 8], [0, 3]]
    n = sum(int(r.targets.sum()) for r in rows)
    assert n == rollouts.target_tokens(samples, 4) == 1 + 3 + 1
    dev = torch.device("cpu")
    assert rows[0].at_targets("advantage", dev).tolist() == [1.0, -1.0, -1.0, -1.0]
    old = rows[0].at_targets("old_logp", dev)
    assert old[0].item() == -0.5 and torch.isnan(old[1:]).all()
    # a rank with no samples left gets a masked copy: same collectives, no targets
    (dummy,) = rollouts.split(samples[:1], rank=1, world=2, micro=2, seq_len=8)
    assert dummy.tokens == 5 and int(dummy.targets.sum()) == 0


def test_rl_metrics_through_the_chunked_path_equal_the_full_logits_ones():
    samples = [sample([1, 2, 3], [4, 5, 6, 7], 1.0, [-3.0, -4.0, -4.5, -4.0]),
               sample([8, 9], [10, 11, 12], -0.5, [-4.0, -4.4, -5.0])]
    (row,) = rollouts.split(samples, 0, 1, micro=2, seq_len=16)
    dev = torch.device("cpu")
    model, ref = tiny_qwen3(), tiny_qwen3(seed=1)
    fast_m, fast_r = token_forward.FastPath.prepare(model), token_forward.FastPath.prepare(ref)
    assert fast_m.chunked_head and fast_m.doc_attention
    logp, ent = token_forward.logprobs(model, row, dev, fast_m)
    with torch.no_grad():
        ref_logp, _ = token_forward.logprobs(ref, row, dev, fast_r)
    old, adv = row.at_targets("old_logp", dev), row.at_targets("advantage", dev)
    stats = rl_metrics.RLStats(dev)
    terms = losses.ppo_clip_terms(logp, old, adv, torch.ones_like(logp, dtype=torch.bool),
                                 losses.PolicyLoss(0.2, 0.2, kl_coef=0.1), ref_logp)
    stats.add_tokens(terms, ent, logp, old, ref_logp)
    fast = stats.finish(logp.numel())
    # the old way: each sample right-padded, full logits, entropy from them
    plain, plain_ref = tiny_qwen3(), tiny_qwen3(seed=1)
    stats = rl_metrics.RLStats(dev)
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        sel = torch.zeros(1, ids.shape[1] - 1, dtype=torch.bool)
        sel[0, len(s.prompt_ids) - 1:] = True
        lg = plain(input_ids=ids).logits[:, :-1]
        lp = exact_logprobs(lg[sel], ids[:, 1:][sel]).float()
        with torch.no_grad():
            rlp = exact_logprobs(plain_ref(input_ids=ids).logits[:, :-1][sel], ids[:, 1:][sel]).float()
        o = torch.tensor(s.logprobs, dtype=torch.float32)
        a = torch.full_like(o, s.advantage)
        t = losses.ppo_clip_terms(lp, o, a, torch.ones_like(lp, dtype=torch.bool),
                                     losses.PolicyLoss(0.2, 0.2, kl_coef=0.1), rlp)
        stats.add(t, lg, sel, lp, o, rlp)
    slow = stats.finish(logp.numel())
    assert fast.keys() == slow.keys()
    for k in fast:
        assert fast[k] == pytest.approx(slow[k], rel=1e-5, abs=1e-7), k
    assert fast["entropy"] > 0 and fast["kl"] > 0


# ---- 3. numerics -------------------------------------------------------------------------
def test_recompute_policy_is_off_when_the_step_fits_and_on_when_it_does_not(monkeypatch):
    model = tiny_qwen3()
    monkeypatch.setattr(numerics, "free_bytes", lambda device: (2**30, "a 1 GiB test device"))
    on, why = numerics.needs_recompute(model, torch.device("cpu"), 1, tokens=4096, dtype_bytes=2)
    assert not on and "off" in why and "1.00 GiB" in why
    # 2 layers x (16 x 48 + 6 x 96) x 2 bytes = 5,376 B/token: 1 GiB holds ~160k tokens (x 1.25)
    on, why = numerics.needs_recompute(model, torch.device("cpu"), 1, tokens=400_000, dtype_bytes=2)
    assert on and "auto: on" in why
    assert numerics.activation_bytes(model.config, 1, 2) == 2 * (16 * 48 + 6 * 96) * 2


def test_the_recipe_field_forces_or_leaves_recompute_to_the_policy():
    from pydantic import ValidationError

    from slurmrl.settings.trainer import TrainerKnobs

    assert TrainerKnobs().gradient_checkpointing == "auto" and TrainerKnobs().compile is True
    assert TrainerKnobs(gradient_checkpointing=True).gradient_checkpointing is True
    assert TrainerKnobs(gradient_checkpointing=False, compile=False).compile is False
    with pytest.raises(ValidationError):
        TrainerKnobs(gradient_checkpointing="sometimes")


def test_fsdp2_on_one_rank_keeps_float32_masters_and_computes_in_bfloat16():
    import torch.distributed as dist

    if dist.is_initialized():  # a group left by another test
        dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        fsdp2_bf16_step_on_one_rank()
    finally:  # a group left behind would be inherited by the trainer tests' forked trainers
        dist.destroy_process_group()


def fsdp2_bf16_step_on_one_rank():
    model = tiny_qwen3().float()
    chunked_head.install(model)
    assert doc_attention.install(model)
    numerics.shard(model, TrainerMesh(Parallel(), 1, 0).fsdp("cpu"), bf16=True)
    opt = numerics.optimizer(model.parameters(), 1e-3, 0.0, cuda=False)
    before = {n: p.detach().full_tensor().clone() for n, p in model.named_parameters()}
    row = packing.pack_documents([([1, 2, 3, 4, 5], [True] * 5), ([6, 7, 8], [True] * 3)])
    logp, ent = token_forward.logprobs(model, row, torch.device("cpu"), token_forward.FastPath(True, True))
    (-logp.sum()).backward()
    opt.step()
    assert all(p.dtype == torch.float32 for p in model.parameters())  # masters and AdamW state in float32
    assert all(s["exp_avg"].dtype == torch.float32 for s in opt.state.values())
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach().full_tensor(), before[n])]
    assert len(changed) == len(before)
    assert logp.dtype == torch.float32 and torch.isfinite(logp).all() and (ent > 0).all()


def test_the_trainer_keeps_cuda_away_in_a_cpu_run(monkeypatch):

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    dist.hide_gpus()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"


# ---- CUDA --------------------------------------------------------------------------------
def cuda_present() -> bool:
    """Asked through NVML: no CUDA context in this (forking) test process."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_present(), reason="needs a CUDA GPU")
def test_gpu_chunked_head_in_bfloat16_matches_full_logits():
    torch.manual_seed(5)
    hidden = torch.randn(3000, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = (0.05 * torch.randn(20000, 256, device="cuda")).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 20000, (3000,), device="cuda")
    logp, _ent = chunked_head.token_logprobs_entropy(hidden, weight, targets, 4096, 1024)
    ref = losses.token_logprobs(hidden @ weight.t(), targets)
    torch.testing.assert_close(logp, ref, rtol=0, atol=2e-2)
    gh, gw = torch.autograd.grad(logp.sum(), (hidden, weight))
    rh, rw = torch.autograd.grad(ref.sum(), (hidden, weight))
    assert (gh.float() - rh.float()).norm() / rh.float().norm() < 2e-2
    assert (gw.float() - rw.float()).norm() / rw.float().norm() < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_present(), reason="needs a CUDA GPU")
def test_gpu_varlen_attention_equals_per_document_attention():
    torch.manual_seed(6)
    q = torch.randn(1, 8, 700, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 4, 700, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 4, 700, 128, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, 100, 101, 600, 700], device="cuda", dtype=torch.int32)
    out, _ = doc_attention.attend(None, q, k, v, None, scaling=128**-0.5, cu_seq_lens_q=cu, max_length_q=500)
    ref = doc_attention._per_document(q, k, v, cu.tolist(), 128**-0.5, True).transpose(1, 2)
    torch.testing.assert_close(out, ref, rtol=0, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_present(), reason="needs a CUDA GPU")
def test_gpu_the_trainers_model_trains_in_bfloat16_under_fsdp2_with_fused_adamw_and_compiled_layers():
    import torch.distributed as dist

    from slurmrl.runtime.trainer.dist import Dist
    from slurmrl.runtime.trainer.model import ready_model

    if dist.is_initialized():
        dist.destroy_process_group()
    d = Dist("bfloat16")
    assert d.cuda and d.bf16
    model, fast = ready_model(tiny_qwen3().float(), d, "auto", compile_layers=True, micro_tokens=64, log=print)
    assert fast.chunked_head and fast.doc_attention
    opt = numerics.optimizer([p for p in model.parameters() if p.requires_grad], 1e-3, 0.0, cuda=True)
    assert opt.defaults["fused"] is True
    rows = rollouts.split([sample(list(range(1, 20)), list(range(20, 60)), 1.0), sample([3, 4], [5, 6, 7], -1.0)],
                          0, 1, 2, 64)
    losses_seen = []
    for _ in range(3):
        logp, ent = token_forward.logprobs(model, rows[0], d.device, fast)
        (-logp.mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses_seen.append(-logp.mean().item())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert losses_seen[-1] < losses_seen[0] and torch.isfinite(ent).all()
    dist.destroy_process_group()
