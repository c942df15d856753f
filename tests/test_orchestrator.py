"""The orchestrator against a real vLLM server: batches, rewards, advantages, bounded staleness."""

from __future__ import annotations

import json
import random

import pytest

from live_components import LiveComponent, free_port_base
from slurmrl.runtime import envs
from slurmrl.runtime.orchestrator import advantages
from slurmrl.runtime.tiny_model import build as build_tiny

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def test_group_relative_advantages():
    a = advantages([1.0, 0.0, 0.5, 0.5])
    assert sum(a) == pytest.approx(0, abs=1e-9) and a[0] > a[2] == a[3] > a[1]
    assert advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]


def test_builtin_environments_score_answers():
    rev, ari = envs.load("reverse_text"), envs.load("arithmetic")
    task = rev.prompts(random.Random(0), 1)[0]
    assert rev.reward(task, task["target"] + "\nmore") == 1.0
    assert rev.reward(task, "zzzz") < 0.5
    t = ari.prompts(random.Random(1), 1)[0]
    assert ari.reward(t, t["target"]) == 1.0 and ari.reward(t, "x") == 0.0
    assert envs.load("slurmrl.runtime.envs.arithmetic:Arithmetic").reward(t, t["target"]) == 1.0


def test_environment_args_reach_the_constructor():
    ari = envs.load("arithmetic", {"few_shot": 2, "max_operand": 3})
    task = ari.prompts(random.Random(2), 1)[0]
    *shots, question = task["prompt"].split("\n")
    assert len(shots) == 2 and question.endswith("=") and ari.reward(task, task["target"]) == 1.0
    for line in shots:  # solved examples: a+b=sum with operands up to max_operand
        lhs, rhs = line.split("=")
        a, b = map(int, lhs.split("+"))
        assert max(a, b) <= 3 and int(rhs) == a + b
    with pytest.raises(SystemExit, match="unexpected keyword argument 'level'"):
        envs.load("reverse_text", {"level": 2})


@pytest.mark.vllm
def test_orchestrator_writes_batches_without_running_ahead(tmp_path):
    from slurmrl.render import render

    model = build_tiny(tmp_path / "tiny")
    out = render(ROOT / "recipes" / "rl-debug.toml", [
        f'model.path="{model}"', "trainer.max_steps=3", "orchestrator.max_off_policy_steps=1",
        "inference.admin_endpoints=true", 'inference.env.VLLM_CPU_KVCACHE_SPACE="1"',
    ], run_dir=tmp_path / "run")
    base = free_port_base()
    server = LiveComponent(out.run_dir / "components" / "inference.toml", out.run_dir, base, groups=2)
    orch = None
    try:
        server.wait_http(f"http://127.0.0.1:{base + 16}/health", timeout=600)
        ready = out.run_dir / "ready" / "attempt-0"
        ready.mkdir(parents=True, exist_ok=True)
        (ready / "trainer.0").write_text("stand-in: no trainer in this test\n")  # the orchestrator waits for it
        orch = LiveComponent(out.run_dir / "components" / "orchestrator.toml", out.run_dir, base, groups=2)
        rollouts = out.run_dir / "rollouts"
        import time

        deadline = time.monotonic() + 180
        while len(list(rollouts.glob("step-*.json"))) < 2 and time.monotonic() < deadline:
            assert orch.proc.poll() is None, orch.tail()
            time.sleep(1)
        time.sleep(3)
        # no trainer published weights: step 3 would be 2 steps off-policy, so it must not exist yet
        assert sorted(p.name for p in rollouts.glob("step-*.json")) == ["step-000001.json", "step-000002.json"]
        batch = json.loads((rollouts / "step-000001.json").read_text())
        assert batch["policy_step"] == 0 and len(batch["samples"]) == 4 * 8
        s = batch["samples"][0]
        assert len(s["completion_ids"]) == len(s["logprobs"]) > 0 and s["prompt_ids"]
        lines = (out.run_dir / "metrics" / "orchestrator.jsonl").read_text().splitlines()
        rec = [json.loads(x) for x in lines]
        assert [r["step"] for r in rec] == [1, 2] and [r["off_policy_lag"] for r in rec] == [0, 1]
        assert 0 <= rec[0]["reward_mean"] <= 1
    finally:
        if orch:
            orch.stop()
        server.stop()
