"""Where one trainer step's time goes: torch.profiler over one fast-path step, kernels by time.

Builds a model as ``trainer_bench.py`` does (a preset, random weights, no download), makes it ready as
the trainer does (``ready_model``: FSDP2 bf16 + float32 masters, compile, recompute by policy on
CUDA), runs two warm-up steps and profiles the third. Prints the top kernels by device time (CUDA)
or by self CPU time (CPU), each with its calls and share of the step, and a line per kind
(attention, GEMM, copy/cast, elementwise, optimizer, other) grouped by the kernel's name.

    python benchmarks/step_profile.py --preset qwen3-0.6b --mode rl --seq 16384   # 1 GPU
    .venv/bin/python benchmarks/step_profile.py --preset tiny                      # CPU
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trainer_bench  # noqa: E402

KINDS = [("attention", r"flash|fmha|attention|scaled_dot_product|cudnn.*attn|softmax"),
         ("GEMM", r"gemm|nvjet|matmul|::mm\b|mm_|cutlass|bmm|addmm|grouped|linear"),
         ("copy/cast", r"copy|cast|to_copy|convert|cat|contiguous"), ("optimizer", r"adam|foreach|multi_tensor"),
         ("elementwise", r"elementwise|vectorized|reduce|mul|add|silu|rsqrt|pow|mean|exp|log")]


def kind(name: str) -> str:
    return next((k for k, pat in KINDS if re.search(pat, name, re.I)), "other")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(trainer_bench.PRESETS), default="tiny")
    ap.add_argument("--mode", choices=("rl", "sft"), default="rl")
    for name in ("seq", "vocab", "batch", "micro", "layers"):
        ap.add_argument(f"--{name}", type=int)
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--recompute", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        os.environ["SLURMRL_TRAINER_DEVICE"] = "cpu"
    from slurmrl.runtime.trainer import numerics
    from slurmrl.runtime.trainer.dist import Dist
    from slurmrl.runtime.trainer.model import ready_model

    d = Dist("bfloat16")
    p = trainer_bench.preset(args)
    gc = {"auto": "auto", "on": True, "off": False}[args.recompute]
    model, fast = ready_model(trainer_bench.build(p), d, gc, compile_layers=args.compile,
                              micro_tokens=p["micro"] * p["seq"], log=lambda m: print(f"# {m}", flush=True))
    optim = numerics.optimizer(model.parameters(), 1e-6, 0.0, d.cuda)
    data = trainer_bench.rl_samples(p, 0) if args.mode == "rl" else trainer_bench.sft_packs(p, args.docs, 0)

    def step():
        trainer_bench.fast_step(args, p, d, model, fast, optim, data)
        if d.cuda:
            torch.cuda.synchronize()

    for _ in range(2):
        step()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if d.cuda else [])
    with profile(activities=acts) as prof:
        step()
    events = prof.key_averages()
    if d.cuda:  # kernels only: device time counted once per kernel
        rows = [(e.key, e.count, e.self_device_time_total) for e in events if e.self_device_time_total > 0
                and e.device_type == torch.autograd.DeviceType.CUDA]
        where = f"device time on {torch.cuda.get_device_name(d.device)}"
    else:
        rows = [(e.key, e.count, e.self_cpu_time_total) for e in events if e.self_cpu_time_total > 0]
        where = f"self CPU time ({torch.get_num_threads()} threads)"
    total = sum(r[2] for r in rows) or 1
    rows.sort(key=lambda r: -r[2])
    print(f"one {args.mode} step, preset {args.preset} ({p['batch']} x {p['seq']} tokens): {total / 1e3:.1f} ms of {where}")
    print(f"{'kernel':<72} {'calls':>6} {'ms':>9} {'share':>6}")
    for name, calls, us in rows[: args.top]:
        print(f"{name[:72]:<72} {calls:>6} {us / 1e3:>9.1f} {100 * us / total:>5.1f}%")
    by_kind: dict[str, float] = {}
    for name, _, us in rows:
        by_kind[kind(name)] = by_kind.get(kind(name), 0.0) + us
    print("by kind: " + ", ".join(f"{k} {v / 1e3:.1f} ms ({100 * v / total:.0f}%)"
                                  for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])))


if __name__ == "__main__":
    main()
