"""The metrics that debug RL (slurmrl/runtime/trainer/rl_metrics.py) on constructed tensors whose
values are known: clip fraction, KL to the reference and to the inference engine (mean and max),
entropy, memory fields, the MFU formula; and the second panel of reward.png, the status row."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from slurmrl.runtime.trainer import losses, rl_metrics  # noqa: E402


def step_stats(logp, old, adv, ref=None, eps=0.2, vocab=4):
    """One micro-batch through ppo_clip_terms and RLStats, as the trainer's rl_step does."""
    logp = torch.tensor(logp).log()
    old = torch.tensor(old).log()
    n = logp.numel()
    terms = losses.ppo_clip_terms(logp, old, torch.tensor(adv), torch.ones(n, dtype=torch.bool),
                                  losses.PolicyLoss(eps, eps),
                                  None if ref is None else torch.tensor(ref).log())
    logits = torch.zeros(1, n, vocab)  # uniform: entropy log(vocab) at every position
    stats = rl_metrics.RLStats(torch.device("cpu"))
    stats.add(terms, logits, torch.ones(1, n, dtype=torch.bool), logp, old,
              None if ref is None else torch.tensor(ref).log())
    return stats.finish(n), stats


def test_clip_fraction_counts_ratios_outside_the_range():
    # ratios 1, 2, 0.5/0.9 = 0.556, 1.1: two of four outside 1 +- 0.2, whatever the advantage's sign
    out, _ = step_stats([0.5, 0.5, 0.5, 0.55], [0.5, 0.25, 0.9, 0.5], [1.0, -1.0, 1.0, 1.0])
    assert out["clip_frac"] == pytest.approx(0.5)
    assert out["ratio_mean"] == pytest.approx((1 + 2 + 0.5 / 0.9 + 1.1) / 4, rel=1e-5)


def test_kl_is_zero_when_the_policy_is_the_reference_and_k3_otherwise():
    p = [0.5, 0.25, 0.9]
    same, _ = step_stats(p, p, [1.0, 1.0, 1.0], ref=p)
    assert same["kl"] == 0.0 and same["kl_max"] == 0.0
    assert same["kl_inference"] == 0.0 and same["kl_inference_max"] == 0.0 and same["clip_frac"] == 0.0
    ref = [0.25, 0.25, 0.45]  # d = log ref - log p: log 0.5, 0, log 0.5
    out, _ = step_stats(p, p, [1.0, 1.0, 1.0], ref=ref)
    k = 0.5 - math.log(0.5) - 1  # e^d - d - 1 at d = log 0.5
    assert out["kl"] == pytest.approx(2 * k / 3, rel=1e-5) and out["kl_max"] == pytest.approx(k, rel=1e-5)
    # against the inference engine's logprobs: the same estimator, d = log old - log new
    inf, _ = step_stats(p, ref, [1.0, 1.0, 1.0])
    assert inf["kl_inference_max"] == pytest.approx(k, rel=1e-5)


def test_no_reference_model_means_no_kl_not_zero():
    out, stats = step_stats([0.5], [0.5], [1.0])
    assert out["kl"] is None and out["kl_max"] is None and not stats.has_ref


def test_entropy_is_the_mean_over_target_tokens():
    out, _ = step_stats([0.5, 0.5], [0.5, 0.5], [1.0, 1.0], vocab=8)
    assert out["entropy"] == pytest.approx(math.log(8), rel=1e-6)


def test_reward_stats():
    assert rl_metrics.reward_stats([0.0, 1.0, 1.0, 0.0]) == {
        "reward_mean": 0.5, "reward_std": 0.5, "reward_min": 0.0, "reward_max": 1.0}


def test_memory_on_cpu_is_the_process_resident_set():
    m = rl_metrics.memory(torch.device("cpu"))
    assert set(m) == {"cpu_rss_gib", "cpu_rss_peak_gib"}
    assert 0 < m["cpu_rss_gib"] <= m["cpu_rss_peak_gib"] + 1e-3


def test_mfu_formula_and_no_invented_peak():
    f = rl_metrics.Flops(n_params=1_000_000, world=2, peak=100.0)
    # (6 N tokens + 2 N ref tokens) / s / devices: (6e9 + 2e9) / 2 s / 2 = 2e9 FLOP/s = 0.002 TFLOP/s
    rec = f.record(tokens=1000, ref_tokens=1000, seconds=2.0)
    assert rec["model_tflops_per_device"] == pytest.approx(0.002) and rec["mfu"] == pytest.approx(0.002 / 100)
    assert rl_metrics.Flops(1000, 1, None).record(10, 0, 1.0)["mfu"] is None
    peak, why = rl_metrics.peak_tflops(torch.device("cpu"), False, None)
    assert peak is None and "unknown on cpu" in why
    assert rl_metrics.peak_tflops(torch.device("cpu"), False, 1.5) == (1.5, "trainer.peak_tflops")


def test_flop_params_leave_out_the_input_embedding(tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from slurmrl.runtime.fixtures.tiny_model import build

    model = AutoModelForCausalLM.from_pretrained(build(tmp_path / "tiny"))
    total = sum(p.numel() for p in model.parameters())
    assert rl_metrics.flop_params(model) == total - model.get_input_embeddings().weight.numel()
