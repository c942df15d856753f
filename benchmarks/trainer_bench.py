"""How fast is a trainer step? Prints figures; asserts nothing.

Times the trainer's own pieces (model set-up as the trainer does it: untied head, gradient
checkpointing, FSDP2 when more than one rank; the SFT token-mean loss or the RL PPO-clip loss;
grad clip; AdamW step) on random tokens, then one weight publish (gather + safetensors + READY).
Prints step time, tokens/s, and on CUDA peak memory and MFU.

    .venv/bin/python benchmarks/trainer_bench.py                    # CPU: tiny model and a ~30M one
    .venv/bin/python benchmarks/trainer_bench.py --hidden 1024 --layers 24 --seq 4096 --micro 1   # ~0.5B, GPU
    torchrun --nproc-per-node=8 benchmarks/trainer_bench.py --hidden 1024 --layers 24 --seq 4096   # FSDP2

MFU = achieved model FLOPs / peak bf16 dense FLOPs, with 6 x params (non-embedding, LM head
included) + 12 x layers x hidden x seq FLOPs per token (the PaLM convention: attention counted
in full, although causal attention does half). Peak: H100/H200 989, A100 312 TFLOP/s, or
``--peak-tflops``.

On a shared CPU machine set ``OMP_NUM_THREADS`` to the cores you really have: on a busy two-core
VM, two OpenMP threads made the tiny step 6-10x slower than one (spin-waiting).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PRESETS = {  # name: (hidden, layers, vocab, seq, micro)
    "tiny": (128, 2, 108, 256, 4),
    "30m": (512, 6, 8192, 256, 4),
}
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "GH200": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def build_model(hidden: int, layers: int, vocab: int, seq: int, intermediate: int | None, d, gc: bool):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from slurmrl.runtime.trainer.loop import shard, untie

    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate or 4 * hidden, num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 64), head_dim=64,
        max_position_embeddings=max(seq, 512), tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    untie(model)
    model.config.use_cache = False
    if gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    model.to(d.device)
    if d.world > 1:
        shard(model, d)
    return model


def count_params(model) -> tuple[int, int]:
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight.numel()
    return total, total - emb


def peak_flops(args, torch) -> float | None:
    if args.peak_tflops:
        return args.peak_tflops * 1e12
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    for key, value in PEAK_BF16.items():
        if key in name:
            return value
    return None


def bench(args, hidden: int, layers: int, vocab: int, seq: int, micro: int, label: str, d) -> None:
    import torch

    from slurmrl.runtime.trainer import losses, state
    from slurmrl.runtime.trainer.loop import grad_norm_and_clip

    model = build_model(hidden, layers, vocab, seq, args.intermediate, d, args.gc)
    total, non_emb = count_params(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-5)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if d.bf16 and d.world == 1
                else torch.autocast(d.device.type, enabled=False))
    g = torch.Generator().manual_seed(d.rank)
    n_tokens = micro * seq * args.accum

    def step() -> None:
        for _ in range(args.accum):
            ids = torch.randint(0, vocab, (micro, seq), generator=g).to(d.device)
            pos = torch.arange(seq, device=d.device).expand(micro, -1)
            with autocast:
                logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
            if args.mode == "sft":
                tgt = torch.ones_like(ids, dtype=torch.bool)
                loss = losses.sft_loss_sum(logits, ids, tgt) / (micro * (seq - 1) * args.accum)
            else:  # RL: the second half of each row is the completion
                sel = torch.zeros((micro, seq - 1), dtype=torch.bool, device=d.device)
                sel[:, seq // 2 :] = True
                lg = logits[:, :-1]
                logp = losses.token_logprobs(lg[sel], ids[:, 1:][sel])
                old = (logp.detach() + 0.01 * torch.randn_like(logp))
                adv = torch.randn(logp.shape, device=d.device)
                terms = losses.ppo_clip_terms(logp, old, adv, torch.ones_like(logp, dtype=torch.bool), 0.2)
                losses.entropy_sum(lg, sel)
                loss = terms["loss"] / (sel.sum() * args.accum)
            loss.backward()
            del logits, loss
        grad_norm_and_clip(model, 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)

    def sync() -> None:
        if d.cuda:
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    sync()
    if d.cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t)
    times.sort()
    med = times[len(times) // 2]
    tok_s = n_tokens * d.world / med
    line = (f"{label:>6}  {total / 1e6:8.1f}M params ({non_emb / 1e6:.1f}M non-embedding)  seq {seq}  "
            f"micro {micro} x accum {args.accum} x ranks {d.world}  {args.mode}  "
            f"step {med * 1000:9.1f} ms (min {times[0] * 1000:.1f})  {tok_s:10.0f} tok/s")
    if d.cuda:
        line += f"  peak mem {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
        peak = peak_flops(args, torch)
        flops_per_token = 6 * non_emb + 12 * layers * hidden * seq
        if peak:
            line += f"  MFU {100 * flops_per_token * tok_s / (peak * d.world):.1f}%"
    if d.rank == 0:
        print(line, flush=True)
    if args.publish:
        with tempfile.TemporaryDirectory() as tmp:
            t = time.perf_counter()
            state.publish_weights(Path(tmp), 1, model, model.config, None, None, None,
                                  torch.bfloat16 if args.dtype == "bfloat16" else torch.float32, 1, d.rank)
            dt = time.perf_counter() - t
            size = sum(f.stat().st_size for f in Path(tmp).rglob("*.safetensors")) if d.rank == 0 else 0
        if d.rank == 0:
            print(f"{'':>6}  weight publish (gather + safetensors + READY): {dt:.2f}s, {size / 2**20:.0f} MiB",
                  flush=True)
    del model, optim
    if d.cuda:
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), action="append",
                    help="default: tiny and 30m (without --hidden)")
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--intermediate", type=int, help="MLP width (default 4 x hidden)")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--micro", type=int, default=1, help="sequences per forward/backward per rank")
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 3 on CPU, 10 on CUDA)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--mode", choices=("sft", "rl"), default="sft")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--gc", action="store_true", help="gradient checkpointing")
    ap.add_argument("--no-publish", dest="publish", action="store_false", help="skip the weight publish timing")
    ap.add_argument("--peak-tflops", type=float, help="peak dense bf16 TFLOP/s per GPU for MFU")
    args = ap.parse_args()

    import torch

    from slurmrl.runtime.trainer.loop import Dist

    d = Dist(args.dtype)
    if args.steps is None:
        args.steps = 10 if d.cuda else 3
    if d.rank == 0:
        dev = torch.cuda.get_device_name() if d.cuda else f"CPU, {torch.get_num_threads()} threads"
        print(f"trainer step benchmark on {dev}; {'bf16 mixed precision' if d.bf16 else 'float32'}; "
              f"{d.world} rank(s){' (FSDP2)' if d.world > 1 else ''}; torch {torch.__version__}", flush=True)
    runs = []
    if args.hidden:
        runs.append(("custom", args.hidden, args.layers, args.vocab, args.seq, args.micro))
    else:
        for name in args.preset or ["tiny", "30m"]:
            runs.append((name, *PRESETS[name]))
    for label, hidden, layers, vocab, seq, micro in runs:
        bench(args, hidden, layers, vocab, seq, micro, label, d)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
