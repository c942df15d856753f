"""RL and SFT end to end on the local Slurm cluster: real vLLM, trainer, orchestrator, requeue.

One RL job does double duty (each costs minutes on two cores): its reward must rise, and a
`scontrol requeue` in the middle must not lose or repeat a step.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from slurmrl.runtime.fixtures.tiny_model import build as build_tiny

pytestmark = [pytest.mark.cluster, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parent.parent
STEPS = 24


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def wait_until(predicate, timeout: float, what: str, run_dir: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(2)
    logs = sorted((run_dir / "logs").rglob("*.log"))
    tail = "\n".join(f"== {p}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:]) for p in logs[-6:])
    raise AssertionError(f"timed out waiting for {what}\n{tail}")


def job_state(cluster, job_id: str) -> str:
    r = cluster.run(["sacct", "-X", "-n", "-P", "-o", "State", "-j", job_id])
    return r.stdout.split()[0] if r.stdout.split() else "UNKNOWN"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("model") / "tiny")


def test_rl_reward_rises_and_a_requeue_loses_no_step(slurm_cluster, tmp_path, tiny):
    r = slurm_cluster.slurmrl(
        "submit", str(ROOT / "recipes" / "rl-debug.toml"),
        "--set", f'model.path="{tiny}"', "--set", f'python.executable="{sys.executable}"',
        "--set", f"trainer.max_steps={STEPS}", "--set", "trainer.checkpoint_every=4",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "rl-debug"
    job_id = json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]
    trainer_log = run_dir / "metrics" / "trainer.jsonl"
    try:
        wait_until(lambda: len(lines(trainer_log)) >= 8, 900, "8 trainer steps", run_dir)
        rq = slurm_cluster.run(["scontrol", "requeue", job_id])
        assert rq.returncode == 0, rq.stderr
        wait_until(lambda: (run_dir / "logs" / "attempt-1").exists(), 300, "the second attempt", run_dir)
        wait_until(lambda: job_state(slurm_cluster, job_id) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"),
                   1200, "the job to end", run_dir)
        logs = slurm_cluster.slurmrl("logs", str(run_dir), cwd=tmp_path).stdout[-4000:]
        assert job_state(slurm_cluster, job_id) == "COMPLETED", logs
    finally:
        slurm_cluster.slurmrl("cancel", str(run_dir), cwd=tmp_path, timeout=180)

    steps = [rec["step"] for rec in lines(trainer_log)]
    assert sorted(steps) == list(range(1, STEPS + 1)), f"steps lost or repeated: {steps}"
    rewards = {rec["step"]: rec["reward_mean"] for rec in lines(run_dir / "metrics" / "orchestrator.jsonl")}
    assert sorted(rewards) == list(range(1, STEPS + 1))
    first = sum(rewards[s] for s in range(1, 6)) / 5
    last = sum(rewards[s] for s in range(STEPS - 4, STEPS + 1)) / 5
    assert last > first + 0.1, f"reward did not rise: first 5 steps {first:.3f}, last 5 {last:.3f}"
    plot = slurm_cluster.slurmrl("plot", str(run_dir), cwd=tmp_path)
    assert plot.returncode == 0 and (run_dir / "reward.png").exists(), plot.stderr
    assert f"latest: batch {STEPS}: reward" in plot.stdout and f"trainer step {STEPS}: loss" in plot.stdout, plot.stdout

    # the metrics that debug RL (docs/rl.md), in the job's own files: every trainer step carries them,
    # and each batch's off-policy lag is the real difference between the trainer step that used it
    # and the policy step (weights) the orchestrator generated it with
    trainer = {rec["step"]: rec for rec in lines(trainer_log)}
    orch = {rec["step"]: rec for rec in lines(run_dir / "metrics" / "orchestrator.jsonl")}
    for step, rec in trainer.items():
        for key in ("entropy", "clip_frac", "kl_inference", "kl_inference_max", "grad_norm", "reward_std",
                    "reward_min", "reward_max", "cpu_rss_gib", "model_tflops_per_device"):
            assert isinstance(rec[key], float), (step, key, rec)
        assert rec["kl"] is None and rec["mfu"] is None  # rl-debug: no KL term, and a CPU has no known peak
        assert rec["off_policy_lag"] == step - 1 - rec["policy_step"] == orch[step]["off_policy_lag"], (step, rec)
        assert rec["policy_step"] == orch[step]["policy_step"] and rec["reward_mean"] == pytest.approx(
            orch[step]["reward_mean"])
        assert orch[step]["reload_s"] >= 0 and "sleep_s" not in orch[step]
    lags = [orch[s]["off_policy_lag"] for s in sorted(orch)]
    assert set(lags) <= {0, 1}, lags  # max_off_policy_steps = 1
    st = slurm_cluster.slurmrl("status", str(run_dir), cwd=tmp_path)
    assert f"latest batch {STEPS}: reward" in st.stdout and "entropy" in st.stdout, st.stdout


def test_sft_loss_falls_on_one_and_two_nodes(slurm_cluster, tmp_path, tiny):
    """Both jobs at once (3 of the cluster's 4 nodes): one on a node, one on two (torchrun across nodes)."""
    data = tmp_path / "sft.jsonl"
    with data.open("w") as f:
        for i in range(64):
            word = "abcab"[i % 3:] + "c"
            f.write(json.dumps({"prompt": f"say {word}:", "completion": f" {word}\n"}) + "\n")
    runs = {}
    for nodes in (1, 2):
        cwd = tmp_path / f"n{nodes}"
        cwd.mkdir()
        r = slurm_cluster.slurmrl(
            "submit", str(ROOT / "recipes" / "sft-debug.toml"),
            "--set", f'model.path="{tiny}"', "--set", f'python.executable="{sys.executable}"',
            "--set", f'trainer.dataset="{data}"', "--set", f"trainer.nodes={nodes}",
            cwd=cwd,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        run_dir = cwd / "runs" / "sft-debug"
        runs[nodes] = (cwd, run_dir, json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"])
    try:
        for nodes, (cwd, run_dir, job_id) in runs.items():
            wait_until(lambda: job_state(slurm_cluster, job_id) in ("COMPLETED", "FAILED", "CANCELLED"), 600,
                       f"the {nodes}-node SFT job to end", run_dir)
            assert job_state(slurm_cluster, job_id) == "COMPLETED", f"{nodes}-node SFT job"
    finally:
        for cwd, run_dir, _ in runs.values():
            slurm_cluster.slurmrl("cancel", str(run_dir), cwd=cwd, timeout=120)
    for nodes, (_, run_dir, _) in runs.items():
        losses = [rec["loss"] for rec in lines(run_dir / "metrics" / "trainer.jsonl")]
        assert len(losses) == 30, nodes
        assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5, (nodes, losses)


def test_a_multi_turn_chat_environment_trains_token_exact(slurm_cluster, tmp_path, tiny):
    """rl-guess-number on the tiny model, 3 steps: conversations through the chat endpoint of a server
    started with the recipe's tool-call parser, every sample token-exact with the environment's tokens
    masked, and the trainer's loss on the model's tokens only."""
    steps = 3
    r = slurm_cluster.slurmrl(
        "submit", str(ROOT / "recipes" / "rl-guess-number.toml"),
        "--set", f'model.path="{tiny}"', "--set", f'python.executable="{sys.executable}"',
        "--set", "model.max_model_len=512", "--set", 'inference.env.VLLM_CPU_KVCACHE_SPACE="1"',
        "--set", f"trainer.max_steps={steps}", "--set", f"trainer.checkpoint_every={steps}", "--set", "trainer.lr=2e-3",
        "--set", "orchestrator.prompts_per_step=2", "--set", "orchestrator.rollouts_per_prompt=4",
        "--set", "trainer.micro_batch_size=8",
        "--set", "orchestrator.max_turns=2", "--set", "orchestrator.max_tokens=4",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "rl-guess-number"
    job_id = json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]
    try:
        wait_until(lambda: job_state(slurm_cluster, job_id) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"),
                   900, "the job to end", run_dir)
        logs = slurm_cluster.slurmrl("logs", str(run_dir), cwd=tmp_path).stdout[-4000:]
        assert job_state(slurm_cluster, job_id) == "COMPLETED", logs
    finally:
        slurm_cluster.slurmrl("cancel", str(run_dir), cwd=tmp_path, timeout=180)
    assert "--tool-call-parser" in (run_dir / "job.sbatch").read_text()
    trainer = {rec["step"]: rec for rec in lines(run_dir / "metrics" / "trainer.jsonl")}
    orch = {rec["step"]: rec for rec in lines(run_dir / "metrics" / "orchestrator.jsonl")}
    assert sorted(trainer) == sorted(orch) == list(range(1, steps + 1))
    masked = 0
    for step in range(1, steps + 1):
        batch = json.loads((run_dir / "rollouts" / f"step-{step:06d}.json").read_text())["samples"]
        assert len(batch) == 8
        for x in batch:
            ids, mask, lps = x["completion_ids"], x["completion_mask"], x["logprobs"]
            assert len(ids) == len(mask) == len(lps) and mask[0] == 1
            assert all((lp is None) == (m == 0) for lp, m in zip(lps, mask))
            masked += mask.count(0)
        assert orch[step]["env/errors"] == orch[step]["env/timeouts"] == 0
        assert orch[step]["env/tokens"] == sum(x["completion_mask"].count(0) for x in batch)
        # the trainer's loss targets are the model's tokens, none of the environment's
        assert trainer[step]["target_tokens"] == sum(sum(x["completion_mask"]) for x in batch)
    assert masked > 0  # a second turn happened: the environment answered
