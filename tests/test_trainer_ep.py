"""Expert parallelism in the trainer's loop (torchrun, two ranks, gloo on CPU): an RL run with
``trainer.parallel.ep = 2`` on a tiny random Qwen3-MoE and a GLM-4-MoE (sigmoid router with a bias,
a shared expert), router replay on (every sample carries recorded experts), a KL reference, activation recompute, equals
the same run with ``ep = 1`` (FSDP2 over both ranks): each step's loss and grad norm, and the
weights after the last optimizer step. The ep=2 run stops after step 2 (its last step then) and a
second start on the same mesh resumes from the checkpoint (expert slices and their AdamW moments)
for step 3, so step 3 equal to the uninterrupted ep=1 run's shows the resume continues exactly.
The published weights (each rank writes its own file) load with transformers as the full model."""

from __future__ import annotations

import base64
import io
import json
import random
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moe_families import config as moe_config  # noqa: E402
from trainer_runs import Trainer, logprob_fn, metrics, run_dir_for  # noqa: E402

from slurmrl.rundir.paths import RunDir  # noqa: E402

STEPS = 3
EXPERTS, TOP_K, LAYERS = 8, 2, 2


def build_glm(out: Path) -> Path:
    """A tiny random GLM-4-MoE with the fixture tokenizer (slurmrl.runtime.fixtures.tiny_model)."""
    from transformers import AutoModelForCausalLM

    from slurmrl.runtime.fixtures.tiny_model import build_tokenizer, vocab

    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    cfg = moe_config("glm4_moe", experts=EXPERTS, top_k=TOP_K, scale=2.5, layers=LAYERS)
    cfg.vocab_size = len(vocab())
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out, safe_serialization=True)
    return out


@pytest.fixture(scope="module", params=["qwen3_moe", "glm4_moe"])
def moe_model(request, tmp_path_factory) -> Path:
    from slurmrl.runtime.fixtures.tiny_model import build

    out = tmp_path_factory.mktemp("model") / request.param
    return build(out, seed=0, hidden=64, layers=LAYERS, moe=True) if request.param == "qwen3_moe" else build_glm(out)


def routed(n_tokens: int, rng: random.Random) -> str:
    """vLLM's routed_experts for a sample: base64 .npy [tokens - 1, layers, top_k] of distinct ids."""
    import numpy as np

    ids = np.array([[rng.sample(range(EXPERTS), TOP_K) for _ in range(LAYERS)] for _ in range(n_tokens - 1)],
                   dtype=np.int32)
    buf = io.BytesIO()
    np.save(buf, ids)
    return base64.b64encode(buf.getvalue()).decode()


def write_rollouts(run_dir: Path, steps, tokenizer, base_logp) -> None:
    rng = random.Random(7)
    for step in steps:
        samples = []
        for i in range(8):
            prompt = tokenizer(f"reverse {'ab'[i % 2]}{i}:", add_special_tokens=False)["input_ids"]
            text = "".join(rng.choice("abcd") for _ in range(3 + i % 4))
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            adv = 1.0 if "a" in text else -1.0
            samples.append({"prompt_ids": prompt, "completion_ids": ids, "logprobs": base_logp(prompt, ids),
                            "advantage": adv, "reward": float(adv > 0),
                            "routed_experts": routed(len(prompt) + len(ids), rng)})
        path = run_dir / "rollouts" / f"step-{step:06d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"step": step, "policy_step": step - 1, "samples": samples}))


def settings(tmp: Path, model: Path, name: str, ep: int, steps: int) -> Path:
    """The planner's trainer.toml for an RL run on two ranks (float32 everywhere: exact comparisons)."""
    return run_dir_for(tmp, "rl-debug.toml", name, [
        f"model.path={model}", "orchestrator.prompts_per_step=2", "orchestrator.rollouts_per_prompt=4",
        "trainer.gpus_per_node=2", "trainer.micro_batch_size=2", "trainer.lr=1e-2", f"trainer.max_steps={steps}",
        "trainer.checkpoint_every=1", "trainer.keep_checkpoints=3", "trainer.kl_coef=0.05", "trainer.seq_len=64",
        "trainer.max_grad_norm=0.5", f"trainer.parallel.ep={ep}",
        # ep=2 recomputes activations in the backward (its all-to-alls run again there), ep=1 keeps them
        f"trainer.gradient_checkpointing={'true' if ep > 1 else 'false'}",
    ], world_size=2)


def run(run_dir: Path, tag: str) -> str:
    t = Trainer(run_dir, ranks=2, tag=tag)
    code = t.wait(timeout=240)
    assert code == 0, t.tail()
    return t.tail(200_000)


def safetensors_state(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.mark.slow  # three torchrun starts of two ranks per family: ~1 min each family on two cores
def test_ep2_rl_run_equals_ep1_and_resumes_exactly(tmp_path, moe_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(moe_model)
    base_logp = logprob_fn(moe_model)
    one = settings(tmp_path, moe_model, "ep1", ep=1, steps=STEPS)
    write_rollouts(one, range(1, STEPS + 1), tok, base_logp)
    log_one = run(one, "a")

    two = settings(tmp_path, moe_model, "ep2", ep=2, steps=2)
    write_rollouts(two, range(1, STEPS + 1), tok, base_logp)
    log = run(two, "a")
    assert "expert parallel: ep 2, 1 expert group(s)" in log, log[-3000:]
    flop_n = re.compile(r"N = ([0-9.]+)M")  # MFU's parameter count: the expert slices count whole
    assert flop_n.findall(log) == flop_n.findall(log_one) != [], (flop_n.findall(log), flop_n.findall(log_one))
    # the same mesh, one step more: resumed from step 2's checkpoint (the planner's file, max_steps 3)
    cfg = RunDir(two).component_config("trainer")
    cfg.write_text(cfg.read_text().replace("max_steps = 2", f"max_steps = {STEPS}"))
    log = run(two, "b")
    assert "resuming after step 2" in log, log[-3000:]
    st = json.loads((two / "checkpoints" / "step-000003" / "state.json").read_text())
    assert st["ep"] == 2

    a, b = metrics(one), metrics(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1))
    for x, y in zip(a, b):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5, abs=1e-6), (x["step"], x["loss"], y["loss"])
        assert y["kl"] == pytest.approx(x["kl"], rel=1e-4, abs=1e-7), (x["step"], x["kl"], y["kl"])
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-5), (x["step"], x["grad_norm"], y["grad_norm"])
    assert a[0]["grad_norm"] > 0.5  # clipped: the clip scaled every expert's gradient too

    # the weights after the last step: the ep=2 checkpoint (gathered) and published folder (each
    # rank its file) are the ep=1 run's full model, under its HF names and shapes
    last = "step-000003"
    ref = safetensors_state(one / "checkpoints" / last / "model")
    ckpt = safetensors_state(two / "checkpoints" / last / "model")
    published = two / "weights" / last
    assert (published / "READY").exists() and (published / "model.safetensors.index.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(published, dtype=torch.float32).state_dict()
    experts = [n for n in ref if ".experts." in n and n.endswith(("gate_up_proj", "down_proj"))]
    assert experts and ref[experts[0]].shape[0] == EXPERTS
    initial = AutoModelForCausalLM.from_pretrained(moe_model, dtype=torch.float32).state_dict()
    assert not torch.allclose(ref[experts[0]], initial[experts[0]])  # the experts were trained
    worst = (0.0, "")
    for name, want in ref.items():
        assert ckpt[name].shape == want.shape, name
        # AdamW's first update is about lr x sign(g) for each weight: float32 rounding of a gradient near
        # zero (where ep=2 sums in another order) can move one weight by up to lr. So: the mean
        # difference against the mean update, and no weight off by more than the three steps' lr
        moved = float((want - initial[name]).abs().mean())
        off = (ckpt[name] - want).abs()
        if moved == 0:  # a buffer (GLM's e_score_correction_bias): never trained
            assert torch.equal(ckpt[name], want), name
            continue
        worst = max(worst, (float(off.mean()) / moved, name))
        assert float(off.mean()) <= 1e-4 * moved and float(off.max()) <= STEPS * 1e-2, (name, off.max(), moved)
        assert torch.equal(loaded[name], ckpt[name]), name  # the published weights are the checkpoint's
    print(f"ep=2 vs ep=1 weights after {STEPS} steps: mean difference at most {worst[0]:.2e} of the mean "
          f"update ({worst[1]})")
