"""How fast is a trainer step, beside the plain transformers step it replaced? Prints figures; asserts nothing.

Each variant runs in its own process (so its peak memory is its own) on random tokens of a
model built from a transformers config (no download), and prints one line:

- ``fast``: the trainer's own path (``slurmrl.runtime.trainer``: ``ready_model`` as the trainer
  calls it, packed rows, chunked LM head + log-softmax, per-document attention; on CUDA bf16
  weights under FSDP2 with float32 masters, fused AdamW, compiled layers, recompute by policy);
- ``unchunked`` (``--unchunked``): the same with full-vocabulary logits at the target positions;
- ``reference`` (``--reference``): the plain transformers step the trainer used to run: float32
  weights under bf16 autocast (CUDA), full recompute, ``model(...).logits`` over every position
  and a second pass for the entropy, RL samples right-padded, SFT rows packed with restarting
  position ids (transformers then builds a dense block-diagonal mask), default AdamW.

    .venv/bin/python benchmarks/trainer_bench.py --preset tiny --reference --unchunked       # CPU
    .venv/bin/python benchmarks/trainer_bench.py --preset 100m --steps 2 --reference         # CPU, ~124M
    python benchmarks/trainer_bench.py --device cuda --preset qwen3-0.6b --mode rl --reference   # 1 GPU

Printed per variant: step time (median), tokens/s, and for RL the weight publish as the trainer
runs it (``publish_figures``): alone, counted in series (the step, then the publish), and counted
beside the next step (steps each followed by a background publish, all counted: what the trainer
does), with the time the step is held for the snapshot; peak memory (CUDA: allocator peak;
CPU: the process's peak resident set, and its rise over what was resident before the first step),
and MFU under two formulas:
``6N`` = 6 x non-embedding parameters (LM head included) per token, as the trainer's metric (MoE
presets: the active ones, a layer's experts counted top_k / experts);
``6N+12LHS`` = that + 12 x layers x hidden x seq (PaLM: attention counted in full), the formula
prime-rl's published MFU uses. Peak: H100/H200 989 TFLOP/s bf16 dense, or ``--peak-tflops``.
On a shared CPU set ``OMP_NUM_THREADS`` to the cores you really have.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PRESETS = {  # Qwen3-shaped: GQA, explicit head_dim
    "tiny": {"hidden": 64, "layers": 2, "heads": 4, "kv": 2, "head_dim": 16, "inter": 192, "vocab": 2048,
             "seq": 256, "batch": 8, "micro": 4},
    "100m": {"hidden": 768, "layers": 12, "heads": 12, "kv": 4, "head_dim": 64, "inter": 2048, "vocab": 32000,
             "seq": 512, "batch": 2, "micro": 1},
    # the true Qwen3-0.6B shape (its config.json; embeddings untied as the trainer publishes them)
    "qwen3-0.6b": {"hidden": 1024, "layers": 28, "heads": 16, "kv": 8, "head_dim": 128, "inter": 3072,
                   "vocab": 151936, "seq": 16384, "batch": 4, "micro": 1, "rope_theta": 1_000_000.0,
                   "max_pos": 40960},
    # MoE: the Qwen3-30B-A3B shape (its config.json: 48 layers, 128 experts, top 8) with as many
    # layers as one GPU holds under the trainer's FSDP2 + float32 masters (--layers: 3 on 80 GB)
    "tiny-moe": {"hidden": 64, "layers": 2, "heads": 4, "kv": 2, "head_dim": 16, "inter": 192, "vocab": 2048,
                 "seq": 256, "batch": 4, "micro": 2, "experts": 8, "top_k": 2, "moe_inter": 32},
    "qwen3-30b-a3b": {"hidden": 2048, "layers": 3, "heads": 32, "kv": 4, "head_dim": 128, "inter": 6144,
                      "vocab": 151936, "seq": 8192, "batch": 2, "micro": 1, "rope_theta": 1_000_000.0,
                      "max_pos": 40960, "experts": 128, "top_k": 8, "moe_inter": 768},
}


def build(p: dict):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    shape = dict(vocab_size=p["vocab"], hidden_size=p["hidden"], intermediate_size=p["inter"],
                 num_hidden_layers=p["layers"], num_attention_heads=p["heads"], num_key_value_heads=p["kv"],
                 head_dim=p["head_dim"], max_position_embeddings=max(p.get("max_pos", 0), p["seq"]),
                 rope_theta=p.get("rope_theta", 10000.0), tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    if "experts" in p:
        cfg = Qwen3MoeConfig(**shape, num_experts=p["experts"], num_experts_per_tok=p["top_k"],
                             moe_intermediate_size=p["moe_inter"], norm_topk_prob=True, decoder_sparse_step=1,
                             mlp_only_layers=[])
        model = Qwen3MoeForCausalLM(cfg).to(torch.float32)
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**shape)).to(torch.float32)
    model.config.use_cache = False
    return model


def rl_samples(p: dict, rank: int) -> list:
    """``batch`` samples of ``seq`` tokens, a quarter prompt, with inference logprobs and advantages."""
    import random

    from slurmrl.contract.rollouts import Sample

    rng = random.Random(rank)
    out = []
    for i in range(p["batch"]):
        prompt = p["seq"] // 4
        out.append(Sample(prompt_ids=tuple(rng.randrange(p["vocab"]) for _ in range(prompt)),
                          completion_ids=tuple(rng.randrange(p["vocab"]) for _ in range(p["seq"] - prompt)),
                          logprobs=tuple(-rng.random() * 5 for _ in range(p["seq"] - prompt)),
                          advantage=(-1.0) ** i, reward=float(i % 2)))
    return out


def sft_packs(p: dict, docs: int, rank: int):
    """``batch`` rows of ``seq`` tokens, each ``docs`` examples end to end (trainer's data.pack)."""
    import numpy as np

    from slurmrl.runtime.trainer.data import Example, pack

    rng = np.random.default_rng(rank)
    n = p["seq"] // docs
    exs = [Example(rng.integers(0, p["vocab"], n).tolist(), [0] * (n // 4) + [1] * (n - n // 4))
           for _ in range(p["batch"] * docs)]
    return pack(exs, np.arange(len(exs)), p["seq"], 0)


def fast_step(args, p, d, model, fast, optim, data):
    import torch

    from slurmrl.runtime.trainer import (
        losses,
        packing,
        rl_metrics,
        rollouts,
        token_forward,
    )
    from slurmrl.runtime.trainer.loop import grad_norm_and_clip

    if args.mode == "rl":
        rows = rollouts.split(data, 0, 1, p["micro"], p["seq"])
    else:
        rows = [packing.pack_sft(data[k: k + p["micro"]]) for k in range(0, len(data), p["micro"])]
    n_tgt = sum(int(r.targets.sum()) for r in rows)
    stats = rl_metrics.RLStats(d.device)
    for row in rows:
        logp, ent = token_forward.logprobs(model, row, d.device, fast)
        if args.mode == "rl":
            old, adv = row.at_targets("old_logp", d.device), row.at_targets("advantage", d.device)
            terms = losses.ppo_clip_terms(logp, old, adv, torch.ones_like(logp, dtype=torch.bool),
                                          losses.PolicyLoss())
            (terms["loss"] / n_tgt).backward()
            stats.add_tokens(terms, ent, logp, old, None)
        else:
            (-logp.sum() / n_tgt).backward()
        del logp, ent
    if args.mode == "rl":
        stats.finish(n_tgt)
    grad_norm_and_clip(model, 1.0)
    optim.step()
    optim.zero_grad(set_to_none=True)


def reference_step(args, p, d, model, optim, data):
    """The trainer's step before the fast path (autocast, full logits, padding or a dense mask)."""
    import numpy as np
    import torch

    from slurmrl.runtime.trainer import losses
    from slurmrl.runtime.trainer.loop import grad_norm_and_clip

    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if d.bf16 else torch.autocast("cpu", enabled=False)
    micro = p["micro"]
    if args.mode == "rl":
        n_tgt = sum(len(s.completion_ids) for s in data)
        for k in range(0, len(data), micro):
            chunk = data[k: k + micro]
            width = max(len(s.prompt_ids) + len(s.completion_ids) for s in chunk)
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            tgt = torch.zeros((len(chunk), width), dtype=torch.bool)
            old = torch.zeros((len(chunk), width))
            for i, s in enumerate(chunk):
                row = list(s.prompt_ids) + list(s.completion_ids)
                ids[i, : len(row)] = torch.tensor(row)
                tgt[i, len(s.prompt_ids): len(row)] = True
                old[i, len(s.prompt_ids): len(row)] = torch.tensor(s.old_logprobs())
            ids, tgt, old = ids.to(d.device), tgt.to(d.device), old.to(d.device)
            pos = torch.arange(width, device=d.device).expand(len(chunk), -1)
            with autocast:
                logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits[:, :-1]
            sel = tgt[:, 1:]
            logp = losses.token_logprobs(logits[sel], ids[:, 1:][sel])
            adv = torch.tensor([[s.advantage] for s in chunk], device=d.device).expand(-1, sel.shape[1])[sel]
            terms = losses.ppo_clip_terms(logp, old[:, 1:][sel], adv, torch.ones_like(logp, dtype=torch.bool),
                                          losses.PolicyLoss())
            (terms["loss"] / n_tgt).backward()
            losses.entropy_sum(logits, sel)
            del logits, logp
    else:
        n_tgt = max(1, int(sum(int(pk.targets.sum()) for pk in data)))
        for k in range(0, len(data), micro):
            chunk = data[k: k + micro]
            ids = torch.from_numpy(np.stack([pk.ids for pk in chunk])).to(d.device)
            pos = torch.from_numpy(np.stack([pk.positions for pk in chunk])).to(d.device)
            tgt = torch.from_numpy(np.stack([pk.targets for pk in chunk])).to(d.device)
            with autocast:
                logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
            (losses.sft_loss_sum(logits, ids, tgt) / n_tgt).backward()
            del logits
    grad_norm_and_clip(model, 1.0)
    optim.step()
    optim.zero_grad(set_to_none=True)


def peak_memory_gib(d, rss_before: int) -> tuple[float, float]:
    """(peak, peak above what was resident before the steps) in GiB: the CUDA allocator's peak
    during the timed steps (both the same), or the process's peak resident set on a CPU."""
    import torch

    from slurmrl.runtime.trainer.rl_metrics import peak_rss_bytes

    if d.cuda:
        peak = torch.cuda.max_memory_allocated(d.device) / 2**30
        return peak, peak
    peak = peak_rss_bytes()
    return peak / 2**30, max(0, peak - rss_before) / 2**30


def preset(args) -> dict:
    return {**PRESETS[args.preset], **{k: v for k in ("seq", "vocab", "batch", "micro", "layers") if (v := getattr(args, k))}}


def active_params(model, p: dict) -> int:
    """Non-embedding parameters a token multiplies with: a MoE layer's experts count top_k / experts."""
    total = sum(q.numel() for q in model.parameters()) - model.get_input_embeddings().weight.numel()
    experts = sum(q.numel() for n, q in model.named_parameters() if ".experts." in n)
    return total - experts + experts * p.get("top_k", 1) // p.get("experts", 1)


def run_variant(args) -> dict:
    """One variant in this process; returns its figures."""
    if args.device == "cpu":
        os.environ["SLURMRL_TRAINER_DEVICE"] = "cpu"
    import torch

    from slurmrl.runtime.trainer.dist import Dist
    from slurmrl.runtime.trainer.model import ready_model, untie
    from slurmrl.runtime.trainer.token_forward import FastPath

    d = Dist("bfloat16" if args.device == "cuda" else "float32")
    p = preset(args)
    model = build(p)
    if args.variant == "reference":
        untie(model)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        model.to(d.device)
        optim = torch.optim.AdamW(model.parameters(), lr=1e-6)
        fast = None
    else:
        gc = {"auto": "auto", "on": True, "off": False}[args.recompute]
        model, fast = ready_model(model, d, gc, compile_layers=args.compile, micro_tokens=p["micro"] * p["seq"],
                                  log=lambda m: print(f"# {m}", file=sys.stderr, flush=True))
        if args.variant == "unchunked":
            fast = FastPath(chunked_head=False, doc_attention=fast.doc_attention, why_not_head="--unchunked")
        from slurmrl.runtime.trainer import numerics

        optim = numerics.optimizer(model.parameters(), 1e-6, 0.0, d.cuda)
    data = rl_samples(p, d.rank) if args.mode == "rl" else sft_packs(p, args.docs, d.rank)
    tokens = p["batch"] * p["seq"]

    def step():
        if fast is None:
            reference_step(args, p, d, model, optim, data)
        else:
            fast_step(args, p, d, model, fast, optim, data)
        if d.cuda:
            torch.cuda.synchronize()

    from slurmrl.runtime.trainer.rl_metrics import rss_bytes

    rss_before = rss_bytes()
    for _ in range(args.warmup):
        step()
    if d.cuda:
        torch.cuda.reset_peak_memory_stats(d.device)
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    step_s = sorted(times)[len(times) // 2]
    peak, peak_step = peak_memory_gib(d, rss_before)
    pub = publish_figures(args, d, model, step) if args.mode == "rl" and args.publish else {}
    total = sum(q.numel() for q in model.parameters())
    non_emb = active_params(model, p)
    return {"variant": args.variant, "preset": args.preset, "vocab": p["vocab"], "mode": args.mode, "seq": p["seq"], "docs": args.docs,
            "tokens": tokens, "step_s": step_s, "publish_s": pub.get("publish_s", 0.0), **pub, "peak_gib": peak, "step_peak_gib": peak_step,
            "params": total, "non_embedding": non_emb, "layers": p["layers"], "hidden": p["hidden"],
            "device": torch.cuda.get_device_name(d.device) if d.cuda else f"CPU, {torch.get_num_threads()} threads",
            "torch": torch.__version__}


def publish_figures(args, d, model, step) -> dict:
    """The trainer's publish (``slurmrl.runtime.trainer.publish``: snapshot, then every rank writes
    its shard in a background thread) of bf16 weights to a temporary folder: alone (the first one
    and the last of two), and beside the steps: ``--steps`` steps, each followed by a publish that
    runs while the next step does, the last one waited for, all counted."""
    import statistics

    import torch

    from slurmrl.runtime.trainer.publish import FolderWriter, Publisher

    with tempfile.TemporaryDirectory() as tmp:
        pub = Publisher(model, d.rank, d.world, torch.bfloat16)
        writer = FolderWriter(Path(tmp), pub.snapshot, model.config, None, None, None, keep=1, log=lambda m: None)
        alone = []
        for i in range(2):
            pub.submit(i + 1, writer.write)
            alone.append(pub.wait())
        held = []
        t = time.perf_counter()
        for i in range(args.steps):
            step()
            held.append(pub.submit(10 + i, writer.write))
        pub.wait()
        beside = (time.perf_counter() - t) / args.steps
    return {"publish_s": alone[-1], "first_publish_s": alone[0], "held_s": statistics.median(held),
            "step_with_publish_s": beside, "publish_bytes": pub.layout.bytes}


def line(r: dict, peak_tflops: float | None) -> str:
    tok_s = r["tokens"] / r["step_s"]
    with_pub = r["tokens"] / (r["step_s"] + r["publish_s"])
    beside = r["tokens"] / r["step_with_publish_s"] if r.get("step_with_publish_s") else 0.0
    out = (f"{r['variant']:>10}  {r['preset']} {r['mode']} seq {r['seq']} vocab {r['vocab']}"
           + (f" ({r['docs']} docs/row)" if r["mode"] == "sft" else "")
           + f"  step {r['step_s'] * 1000:9.1f} ms  {tok_s:9.0f} tok/s"
           + (f"  publish alone {r['publish_s']:.2f} s (first {r['first_publish_s']:.2f} s, "
              f"{r['publish_bytes'] / 1e9:.2f} GB): {with_pub:9.0f} tok/s in series, {beside:9.0f} tok/s beside "
              f"the next step ({beside / tok_s:.2f}x; the step held {r['held_s'] * 1000:.0f} ms)"
              if r["publish_s"] else "")
           + f"  peak {r['peak_gib']:.2f} GiB" + ("" if r["peak_gib"] == r["step_peak_gib"] else
                                                 f" ({r['step_peak_gib']:.2f} GiB above the loaded model)"))
    if peak_tflops:
        f6n = 6 * r["non_embedding"]
        palm = f6n + 12 * r["layers"] * r["hidden"] * r["seq"]
        out += (f"  MFU 6N {100 * f6n * tok_s / (peak_tflops * 1e12):.1f}%"
                f"  MFU 6N+12LHS {100 * palm * tok_s / (peak_tflops * 1e12):.1f}%")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--mode", choices=("rl", "sft"), default="rl")
    ap.add_argument("--seq", type=int, help="tokens per sample (default: the preset's)")
    ap.add_argument("--vocab", type=int, help="vocabulary size (default: the preset's)")
    ap.add_argument("--batch", type=int, help="samples (RL) or rows (SFT) per step (default: the preset's)")
    ap.add_argument("--micro", type=int, help="samples or rows per micro-batch (default: the preset's)")
    ap.add_argument("--layers", type=int, help="decoder layers (default: the preset's)")
    ap.add_argument("--docs", type=int, default=4, help="SFT: examples packed per row (1 = unpacked)")
    ap.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda where there is one")
    ap.add_argument("--steps", type=int, default=3, help="timed steps (median reported)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reference", action="store_true", help="also run the plain transformers step")
    ap.add_argument("--unchunked", action="store_true", help="also run the fast path with full logits")
    ap.add_argument("--recompute", choices=("auto", "on", "off"), default="auto",
                    help="the fast path's activation recompute (the reference always recomputes)")
    ap.add_argument("--no-compile", dest="compile", action="store_false", help="CUDA: leave the layers eager")
    ap.add_argument("--no-publish", dest="publish", action="store_false", help="skip the weight publish timing")
    ap.add_argument("--peak-tflops", type=float, help="peak dense TFLOP/s of the device, for MFU")
    ap.add_argument("--variant", choices=("fast", "unchunked", "reference"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.device is None:
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # no CUDA context before the children
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.variant:  # a child: one JSON line
        print(json.dumps(run_variant(args)), flush=True)
        return
    variants = ["fast"] + (["unchunked"] if args.unchunked else []) + (["reference"] if args.reference else [])
    passed = [a for a in sys.argv[1:]]
    results = []
    for v in variants:
        cmd = [sys.executable, str(Path(__file__).resolve()), *passed, "--device", args.device, "--variant", v]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              check=False)
        if proc.returncode:
            print(f"{v}: failed (exit {proc.returncode})\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(r)
        notes = [x for x in proc.stderr.splitlines() if x.startswith("# ")]
        if not results[:-1]:
            print(f"trainer step on {r['device']}, torch {r['torch']}; {r['params'] / 1e6:.1f}M parameters "
                  f"({r['non_embedding'] / 1e6:.1f}M non-embedding, active per token); {r['tokens']} tokens per step", flush=True)
        for n in notes:
            print(f"{'':>10}  {n[2:]}")
        print(line(r, args.peak_tflops or (989.0 if "H100" in r["device"] or "H200" in r["device"] else None)),
              flush=True)
    ref = next((r for r in results if r["variant"] == "reference"), None)
    if ref:
        for r in results:
            if r is not ref:
                print(f"{r['variant']:>10} / reference: {ref['step_s'] / r['step_s']:.2f}x tokens/s, "
                      f"{r['step_peak_gib'] / max(ref['step_peak_gib'], 1e-9):.2f}x the step's peak memory")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
