"""The orchestrator against a real vLLM server: batches, rewards, advantages, bounded staleness.

``components/orchestrator.toml`` is what the planner writes (OrchestratorSettings, through
``slurmrl.settings.orchestrator.orchestrator_settings``); the URLs come on the command line, as the
job script passes them."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from orchestrator_servers import serve, stop, wait_health
from supervised_processes import free_port

from slurmrl import envs
from slurmrl.envs.heldout import heldout_tasks
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import read_ready, write_ready
from slurmrl.runtime.fixtures.tiny_model import build as build_tiny
from slurmrl.runtime.orchestrator.batch import advantages
from slurmrl.runtime.orchestrator.loop import arguments

ROOT = Path(__file__).resolve().parent.parent


def test_group_relative_advantages():
    a = advantages([1.0, 0.0, 0.5, 0.5])
    assert sum(a) == pytest.approx(0, abs=1e-9) and a[0] > a[2] == a[3] > a[1]
    assert advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]


def test_group_mean_advantages_are_not_divided_by_the_std():
    """orchestrator.advantage = "group_mean" (Dr. GRPO): a group whose rewards barely differ keeps small
    advantages, where dividing by its std would blow them up to about +-1."""
    near = [0.50, 0.51, 0.49, 0.50]
    assert advantages(near, by_std=False) == pytest.approx([0.0, 0.01, -0.01, 0.0], abs=1e-12)
    assert max(abs(a) for a in advantages(near)) > 1.0
    assert advantages([0.3, 0.3, 0.3], by_std=False) == [0.0, 0.0, 0.0]


def test_builtin_environments_score_answers():
    rev, ari = envs.load("reverse_text"), envs.load("arithmetic")
    task = rev.prompts(random.Random(0), 1)[0]
    assert rev.reward(task, task["target"] + "\nmore") == 1.0
    assert rev.reward(task, "zzzz") < 0.5
    t = ari.prompts(random.Random(1), 1)[0]
    assert ari.reward(t, t["target"]) == 1.0 and ari.reward(t, "x") == 0.0
    assert envs.load("slurmrl.envs.arithmetic:Arithmetic").reward(t, t["target"]) == 1.0


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


def test_command_line_names_where_requests_and_reloads_go():
    args = arguments(["--config", "c.toml", "--requests-url", "http://r:1/", "--admin-urls", "http://a:2", "http://b:3"])
    assert args.requests_url == ["http://r:1"] and args.admin_urls == ["http://a:2", "http://b:3"]
    with pytest.raises(SystemExit):
        arguments(["--config", "c.toml", "--admin-urls", "http://a:2"])  # no --requests-url


@pytest.mark.vllm
def test_orchestrator_writes_batches_without_running_ahead(tmp_path):
    from slurmrl.recipe.load import load_recipe
    from slurmrl.recipe.roles import orchestrator_settings
    from slurmrl.rundir.tomlw import dumps

    model = build_tiny(tmp_path / "tiny")
    recipe = load_recipe(ROOT / "recipes" / "rl-debug.toml", [
        f'model.path="{model}"', "trainer.max_steps=3", "orchestrator.max_off_policy_steps=1",
        "eval.every=2",  # [eval]: the base model (step 0) on reverse_text's held-out split, before step 1
    ])
    run_dir = tmp_path / "run"
    config = RunDir(run_dir).component_config("orchestrator")
    config.parent.mkdir(parents=True)
    config.write_text(dumps(orchestrator_settings(recipe, str(run_dir)).model_dump(mode="json")))
    (run_dir / "logs").mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = serve(model, port, run_dir / "logs" / "inference.0.log")
    orch = None
    try:
        wait_health(url, server, run_dir / "logs" / "inference.0.log")
        # the orchestrator waits for the trainer's ready file (stand-in: no trainer in this test)
        write_ready(RunDir(run_dir).ready_file(0, "trainer", 0), None, 1)
        log = run_dir / "logs" / "orchestrator.0.log"
        orch = subprocess.Popen(
            [sys.executable, "-m", "slurmrl.runtime.orchestrator", "--config", str(config),
             "--requests-url", url, "--admin-urls", url],
            env={**os.environ, "SLURMRL_ATTEMPT": "0", "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)},
            stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=run_dir,
        )
        rollouts = run_dir / "rollouts"
        deadline = time.monotonic() + 180
        while len(list(rollouts.glob("step-*.json"))) < 2 and time.monotonic() < deadline:
            assert orch.poll() is None, log.read_text()[-4000:]
            time.sleep(1)
        time.sleep(3)
        # no trainer published weights: step 3 would be 2 steps off-policy, so it must not exist yet
        assert sorted(p.name for p in rollouts.glob("step-*.json")) == ["step-000001.json", "step-000002.json"]
        batch = json.loads((rollouts / "step-000001.json").read_text())
        assert batch["policy_step"] == 0 and len(batch["samples"]) == 4 * 8
        s = batch["samples"][0]
        assert len(s["completion_ids"]) == len(s["logprobs"]) > 0 and s["prompt_ids"]
        # the trainer's reader takes the written batch as it is: typed, then packed into rows to train on
        from slurmrl.runtime.trainer import rollouts as trainer_rollouts

        typed = trainer_rollouts.read_batch(rollouts / "step-000001.json")
        assert json.loads(typed.dumps()) == batch and typed.policy_step == 0
        rows = trainer_rollouts.split(typed.samples, 0, 1, 8, seq_len=4096)
        assert sum(int(r.targets.sum()) for r in rows) == sum(len(x["completion_ids"]) for x in batch["samples"])
        lines = (run_dir / "metrics" / "orchestrator.jsonl").read_text().splitlines()
        rec = [json.loads(x) for x in lines]
        assert [r["step"] for r in rec] == [1, 2] and [r["off_policy_lag"] for r in rec] == [0, 1]
        assert 0 <= rec[0]["reward_mean"] <= 1
        assert read_ready(RunDir(run_dir).ready_file(0, "orchestrator", 0))[:2] == (None, 1)
        # the evaluation of the weights the servers had (the base model's: no trainer here), on held-out
        # prompts that no batch was generated from
        evals = [json.loads(x) for x in RunDir(run_dir).eval_metrics.read_text().splitlines()]
        held = heldout_tasks(envs.load("reverse_text", {}), 32, 0.1, seed=0)
        assert [e["step"] for e in evals] == [0] and evals[0]["prompts"] == len(held) > 0
        assert evals[0]["split"] == "heldout" and evals[0]["samples_per_prompt"] == 1
        assert 0 <= evals[0]["reward_mean"] <= 1 and 0 <= evals[0]["pass@1"] <= 1 and evals[0]["eval_s"] > 0
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model)
        held_ids = {tuple(tok(t["prompt"], add_special_tokens=False)["input_ids"]) for t in held}
        trained = {tuple(x["prompt_ids"]) for n in (1, 2)
                   for x in json.loads((rollouts / f"step-00000{n}.json").read_text())["samples"]}
        assert trained and not trained & held_ids
    finally:
        stop(orch)
        stop(server)
