"""The trainer runtime with real torch on CPU: SFT (one rank; two ranks with FSDP2 over gloo),
RL from rollout files, published weights, checkpoint on TERM and resume.

``components/trainer.toml`` is what the planner writes for a real recipe (its TrainerSettings,
through ``slurmrl.settings.trainer.trainer_settings``); the trainer runs as the job script would
start it (``python -m slurmrl.runtime.trainer --config ...``, or under torchrun), with the
environment the script exports. Processes are stopped by pid.
"""

from __future__ import annotations

import json
import math
import random
import signal
import time
from pathlib import Path

import pytest
from trainer_runs import (  # noqa: F401 - tiny, tokenizer: the fixtures
    FAVOURED,
    Trainer,
    logprob_fn,
    metrics,
    run_dir_for,
    tiny,
    tokenizer,
    torch,
    write_rollouts,
)

from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import read_ready

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("transformers")

SFT_STEPS = 30
FSDP_STEPS = 15
CP_STEPS = 6
RL_STEPS = 5


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> Path:
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("data") / "sft.jsonl"
    with path.open("w") as f:
        for i in range(160):
            w = "".join(rng.choice("abcd") for _ in range(rng.randint(3, 6)))
            chat = [{"role": "user", "content": f"reverse {w}"}, {"role": "assistant", "content": w[::-1]}]
            row = {"prompt": f"reverse {w}:", "completion": f" {w[::-1]}"} if i % 2 else {"messages": chat}
            f.write(json.dumps(row) + "\n")
    return path


def sft_overrides(tiny: Path, data: Path, gpus: int) -> list[str]:
    return [
        f"model.path={tiny}", f"trainer.dataset={data}", f"trainer.gpus_per_node={gpus}", "trainer.batch_size=4",
        "trainer.micro_batch_size=2", "trainer.seq_len=64", "trainer.lr=3e-3", f"trainer.max_steps={SFT_STEPS}",
        "trainer.checkpoint_every=10", "trainer.keep_checkpoints=2", "trainer.dtype=bfloat16",
        "trainer.gradient_checkpointing=true",
    ]


# ---- SFT --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sft_single(tmp_path_factory, tiny, sft_data) -> dict:
    """One rank; TERM mid-run (exit 143 after a checkpoint), then a second start finishes."""
    run_dir = run_dir_for(tmp_path_factory.mktemp("sft1"), "sft-1node.toml", "run", sft_overrides(tiny, sft_data, 1))
    first = Trainer(run_dir, tag="a")
    first.until(lambda: len(metrics(run_dir)) >= 12, "12 steps")
    first.proc.send_signal(signal.SIGTERM)
    code_a = first.wait()
    stopped_at = metrics(run_dir)[-1]["step"]
    second = Trainer(run_dir, tag="b")
    code_b = second.wait()
    return {"run_dir": run_dir, "codes": (code_a, code_b), "stopped_at": stopped_at, "logs": (first, second)}


def test_sft_loss_falls_and_resumes_after_term(sft_single):
    run_dir = sft_single["run_dir"]
    first, second = sft_single["logs"]
    assert sft_single["codes"] == (143, 0), first.tail() + second.tail()
    k = sft_single["stopped_at"]
    assert 12 <= k < SFT_STEPS
    assert f"resuming after step {k}" in second.tail(100_000)
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, SFT_STEPS + 1))  # every step exactly once
    loss = [r["loss"] for r in rows]
    assert all(math.isfinite(x) for x in loss)
    assert sum(loss[-5:]) / 5 < 0.5 * sum(loss[:3]) / 3, loss
    # checkpoints: the newest two, complete, with the data position
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == [f"step-{max(20, k):06d}", f"step-{SFT_STEPS:06d}"], ckpts  # periodic 10, 20; k on TERM; 30
    last = run_dir / "checkpoints" / f"step-{SFT_STEPS:06d}"
    for name in ("DONE", "optimizer.pt", "state.json", "rng-rank0.pt", "model/config.json"):
        assert (last / name).exists(), name
    st = json.loads((last / "state.json").read_text())
    assert st["step"] == SFT_STEPS and set(st["data"]) == {"epoch", "index"}
    # the final weights are published like RL weights, and the component marked itself ready
    assert (run_dir / "weights" / f"step-{SFT_STEPS:06d}" / "READY").exists()
    assert read_ready(RunDir(run_dir).ready_file(0, "trainer", 0))[:2] == (None, 1)
    # a third start has nothing left to do
    third = Trainer(run_dir, tag="c")
    assert third.wait() == 0 and "nothing to do" in third.tail()
    assert len(metrics(run_dir)) == SFT_STEPS


@pytest.mark.slow  # ~13 s: torchrun with two ranks
def test_sft_two_ranks_fsdp2_matches_one_rank(tmp_path, tiny, sft_data, sft_single):
    """torchrun, two ranks, gloo, FSDP2: runs, loss falls, and the losses are those of one rank
    (same data order, token-mean loss over the global batch), also across its TERM + resume."""
    from slurmrl.settings.trainer import load

    run_dir = run_dir_for(tmp_path, "sft-1node.toml", "run",
                         [*sft_overrides(tiny, sft_data, 2), f"trainer.max_steps={FSDP_STEPS}"], world_size=2)
    assert load(RunDir(run_dir).component_config("trainer")).world_size == 2
    t = Trainer(run_dir, ranks=2)
    code = t.wait(timeout=150)
    assert code == 0, t.tail()
    assert "FSDP2" in t.tail(100_000)
    two = metrics(run_dir)
    one = metrics(sft_single["run_dir"])
    assert [r["step"] for r in two] == list(range(1, FSDP_STEPS + 1))
    assert sum(r["loss"] for r in two[-3:]) < 0.6 * sum(r["loss"] for r in two[:3])
    for a, b in zip(one, two):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3, abs=1e-3), (a["step"], a["loss"], b["loss"])
    ck = run_dir / "checkpoints" / f"step-{FSDP_STEPS:06d}"
    assert (ck / "rng-rank0.pt").exists() and (ck / "rng-rank1.pt").exists() and (ck / "DONE").exists()


@pytest.mark.slow  # ~15 s each: torchrun with two ranks
@pytest.mark.parametrize("style", ["ulysses", "ring"])
def test_sft_context_parallel_two_ranks_matches_one_rank(tmp_path, tiny, sft_data, sft_single, style):
    """trainer.parallel.cp = 2 on two ranks: every row is split over both (Ulysses or ring attention
    across them), so the losses are one rank's, step for step."""
    run_dir = run_dir_for(tmp_path, "sft-1node.toml", "run", [*sft_overrides(tiny, sft_data, 2),
                          f"trainer.max_steps={CP_STEPS}", "trainer.parallel.cp=2",
                          f"trainer.parallel.cp_style={style}"], world_size=2)
    t = Trainer(run_dir, ranks=2)
    assert t.wait(timeout=150) == 0, t.tail()
    assert f"context parallel: cp 2 ({style}), 1 data-parallel group(s)" in t.tail(100_000)
    one, two = metrics(sft_single["run_dir"]), metrics(run_dir)
    assert [r["step"] for r in two] == list(range(1, CP_STEPS + 1))
    for a, b in zip(one, two):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-4), (a["step"], a["loss"], b["loss"])


@pytest.mark.slow  # ~40 s: torchrun with four ranks
def test_sft_hsdp_four_ranks_matches_one_rank(tmp_path, tiny, sft_data, sft_single):
    """trainer.parallel.dp_replicate = 2 on four ranks: two copies of the model, each sharded over two
    ranks (HSDP: a 2-D FSDP2 mesh); every rank takes its own rows, so the losses are one rank's."""
    run_dir = run_dir_for(tmp_path, "sft-1node.toml", "run", [*sft_overrides(tiny, sft_data, 4),
                          "trainer.micro_batch_size=1", f"trainer.max_steps={CP_STEPS}",
                          "trainer.parallel.dp_replicate=2"], world_size=4)
    t = Trainer(run_dir, ranks=4)
    assert t.wait(timeout=240) == 0, t.tail()
    assert "FSDP2 HSDP (2 replicas x 2 shards)" in t.tail(100_000)
    one, four = metrics(sft_single["run_dir"]), metrics(run_dir)
    assert [r["step"] for r in four] == list(range(1, CP_STEPS + 1))
    for a, b in zip(one, four):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3, abs=1e-3), (a["step"], a["loss"], b["loss"])
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-2), (a["step"], a["grad_norm"], b["grad_norm"])


def first_token_logprob(model_dir: Path, tokenizer, char: str) -> float:
    prompt = tokenizer("reverse ab:", add_special_tokens=False)["input_ids"]
    tid = tokenizer(char, add_special_tokens=False)["input_ids"][0]
    return logprob_fn(model_dir)(prompt, [tid])[0]


def test_rl_learns_publishes_untied_weights_and_resumes(tmp_path, tiny, tokenizer):
    run_dir = run_dir_for(tmp_path, "rl-debug.toml", "run", [
        f"model.path={tiny}", "orchestrator.prompts_per_step=2", "orchestrator.rollouts_per_prompt=4",
        "trainer.micro_batch_size=4", "trainer.lr=3e-3", f"trainer.max_steps={RL_STEPS}", "trainer.checkpoint_every=2",
        "trainer.keep_checkpoints=2", "trainer.kl_coef=0.01", "trainer.seq_len=64",
    ])
    # weights left by an earlier attempt that never checkpointed: overwritten, not trusted
    stale = run_dir / "weights" / "step-000001"
    stale.mkdir(parents=True)
    (stale / "READY").write_text("stale\n")
    base_logp = logprob_fn(tiny)
    write_rollouts(run_dir, range(1, 4), tokenizer, base_logp)

    first = Trainer(run_dir, tag="a")
    first.until(lambda: len(metrics(run_dir)) >= 3, "3 steps")
    first.proc.send_signal(signal.SIGTERM)  # while it waits for step 4's batch
    assert first.wait() == 143, first.tail()
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["step-000002", "step-000003"], ckpts
    st = json.loads((run_dir / "checkpoints" / "step-000003" / "state.json").read_text())
    assert st["data"] == {"next_rollout": 4}

    write_rollouts(run_dir, range(4, RL_STEPS + 1), tokenizer, base_logp)
    second = Trainer(run_dir, tag="b")
    assert second.wait() == 0, second.tail()
    assert "resuming after step 3" in second.tail(100_000)

    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, RL_STEPS + 1))
    for r in rows:
        for key in ("loss", "kl", "kl_inference", "entropy", "clip_frac", "tokens_per_s", "step_time_s", "wait_s",
                    "grad_norm"):
            assert math.isfinite(r[key]), (key, r)
    assert rows[0]["clip_frac"] == 0.0 and rows[-1]["kl"] > 0  # on-policy at step 1; drifted from the reference later
    # the metrics that debug RL (docs/rl.md): maxima bound means, the lag is the real step difference
    # (write_rollouts: the batch of step s came from the weights of step max(0, s - 2)), memory is the
    # process's resident set on a CPU, and MFU is left out where no peak is known
    assert [r["off_policy_lag"] for r in rows] == [r["step"] - 1 - max(0, r["step"] - 2) for r in rows]
    assert [r["off_policy_lag"] for r in rows[:3]] == [0, 1, 1]
    for r in rows:
        assert r["kl_max"] >= r["kl"] >= 0 and r["kl_inference_max"] >= r["kl_inference"] >= 0
        assert r["reward_min"] <= r["reward_mean"] <= r["reward_max"] and r["reward_std"] >= 0
        assert r["cpu_rss_gib"] > 0.1 and not any(k.startswith("cuda_") for k in r)
        assert r.get("mfu") is None and r["model_tflops_per_device"] > 0  # not measured: left out of the row

    # weights: newest keep_checkpoints, READY written last, untied LM head, tokenizer alongside
    weights = sorted(p.name for p in (run_dir / "weights").iterdir())
    assert weights == ["step-000004", "step-000005"], weights
    newest = run_dir / "weights" / "step-000005"
    files = [p for p in newest.iterdir() if p.name != "READY"]
    assert all(p.stat().st_mtime_ns <= (newest / "READY").stat().st_mtime_ns for p in files)
    assert json.loads((newest / "config.json").read_text())["tie_word_embeddings"] is False
    assert (newest / "tokenizer.json").exists() and (newest / "tokenizer_config.json").exists()
    from safetensors import safe_open

    with safe_open(str(newest / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert "lm_head.weight" in keys and "model.embed_tokens.weight" in keys
        assert not torch.equal(f.get_tensor("lm_head.weight"), f.get_tensor("model.embed_tokens.weight"))

    # the policy moved towards the favoured token
    before = first_token_logprob(tiny, tokenizer, FAVOURED)
    after = first_token_logprob(newest, tokenizer, FAVOURED)
    assert after > before + 0.1, (before, after)


# ---- pieces, in process -----------------------------------------------------------------
def test_packing_masks_and_isolates_examples(tiny, tokenizer):
    """Loss targets are exactly the completion/assistant tokens, and an example packed after
    another gets the same logits as on its own (position ids restart; no cross attention)."""
    import numpy as np
    from transformers import AutoModelForCausalLM

    from slurmrl.runtime.trainer.data import encode, pack

    pc = encode(tokenizer, {"prompt": "reverse ab:", "completion": " ba"})
    marked = tokenizer.decode([t for t, m in zip(pc.ids, pc.mask) if m])
    assert marked == " ba" + tokenizer.eos_token
    turns = [("user", "hi"), ("assistant", "yo"), ("user", "again"), ("assistant", "ok")]
    chat = encode(tokenizer, {"messages": [{"role": r, "content": c} for r, c in turns]})
    assert tokenizer.decode([t for t, m in zip(chat.ids, chat.mask) if m]) == "yo<|end|>ok<|end|>"

    packs = pack([pc, chat], np.array([0, 1]), 64, tokenizer.pad_token_id)
    assert len(packs) == 1
    p = packs[0]
    n0 = len(pc.ids)
    assert p.positions[n0] == 0 and not p.targets[n0] and p.used == n0 + len(chat.ids)
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    with torch.no_grad():
        packed = model(input_ids=torch.from_numpy(p.ids[None]), position_ids=torch.from_numpy(p.positions[None]),
                       use_cache=False).logits[0, n0 : n0 + len(chat.ids)]
        alone = model(input_ids=torch.tensor([chat.ids]), use_cache=False).logits[0]
    torch.testing.assert_close(packed, alone, rtol=1e-4, atol=1e-4)


def test_ppo_clip_terms():
    from slurmrl.runtime.trainer.losses import PolicyLoss, ppo_clip_terms

    logp = torch.log(torch.tensor([0.5, 0.5, 0.5, 0.5])).requires_grad_()
    old = torch.log(torch.tensor([0.5, 0.25, 0.9, float("nan")]))  # NaN: no inference logprob -> ratio 1
    adv = torch.tensor([1.0, 1.0, -1.0, 2.0])
    out = ppo_clip_terms(logp, old, adv, torch.ones(4, dtype=torch.bool), PolicyLoss(0.2, 0.2))
    # ratios 1, 2 -> 1.2 (A > 0), 0.56 -> 0.8 (A < 0: the pessimistic term), 1
    assert out["loss"].item() == pytest.approx(-1.0 - 1.2 + 0.8 - 2.0, abs=1e-5)
    assert out["clip"].item() == 2.0
    out["loss"].backward()
    assert logp.grad[1].item() == 0.0 and logp.grad[2].item() == 0.0  # clipped tokens carry no gradient
    assert logp.grad[0].item() == pytest.approx(-1.0)


def test_a_save_that_might_not_fit_before_the_time_limit_is_made_early(tmp_path, tiny, sft_data, monkeypatch):
    """SLURMRL_JOB_END (the script reads it from squeue) already near: the trainer saves at once,
    once, instead of waiting for a warning signal whose save would be killed half-written."""
    overrides = [o for o in sft_overrides(tiny, sft_data, 1) if not o.startswith(("trainer.max_steps", "trainer.checkpoint"))]
    run_dir = run_dir_for(tmp_path, "sft-1node.toml", "run", overrides + ["trainer.max_steps=3",
                                                                          "trainer.checkpoint_every=100"])
    monkeypatch.setenv("SLURMRL_JOB_END", str(int(time.time()) + 5))
    t = Trainer(run_dir)
    assert t.wait() == 0, t.tail()
    log = t.tail(100_000)
    assert log.count("checkpoint (early: a save at the next step might not finish before the time limit)") == 1, log
    assert "checkpoint (last step)" in log
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000001", "step-000003"]
