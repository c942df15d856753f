"""The trainer component itself, started as job.sbatch starts it, on rollout files: tokens/s and sync.

Writes a run dir with a random model of a ``trainer_bench.py`` preset (saved as HF safetensors with
the test tokenizer), ``components/trainer.toml`` (RL, filesystem weight sync, recompute and compile as
the settings default) and ``--steps`` rollout files of ``batch`` x ``seq`` random tokens (a quarter
prompt), then runs ``torchrun --standalone --nproc-per-node=1 -m slurmrl.runtime.trainer`` on it and
prints, per step, what the trainer logged in ``metrics/trainer.jsonl``: step time, tokens/s, the
weight publish after the step (``sync_s``), and tokens/s counting it; then the median over steps 2..N
(step 1 compiles). The last checkpoint is written but not timed here.

    python benchmarks/component_bench.py --preset qwen3-0.6b --seq 16384 --steps 4   # 1 GPU
    .venv/bin/python benchmarks/component_bench.py --preset tiny --steps 3            # CPU
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trainer_bench  # noqa: E402

ROOT = trainer_bench.ROOT


def prepare(run: Path, args, p: dict) -> Path:
    from slurmrl.contract.rollouts import RolloutBatch
    from slurmrl.rundir import tomlw
    from slurmrl.runtime.fixtures.tiny_model import build_tokenizer
    from slurmrl.runtime.step_files import rollout_path, write_json_atomic
    from slurmrl.settings.trainer import TrainerSettings

    model_dir = run / "model"
    trainer_bench.build(p).save_pretrained(model_dir)
    build_tokenizer(model_dir)
    settings = TrainerSettings(run_dir=str(run), kind="rl", model=str(model_dir), world_size=1,
                               global_batch=p["batch"], micro_batch_size=p["micro"], seq_len=p["seq"],
                               max_steps=args.steps, checkpoint_every=args.steps, keep_checkpoints=1)
    config = run / "components" / "trainer.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(tomlw.dumps(settings.model_dump(mode="json", exclude_none=True)))
    for n in range(1, args.steps + 1):
        batch = RolloutBatch(step=n, policy_step=n - 1, samples=tuple(trainer_bench.rl_samples(p, n)))
        write_json_atomic(rollout_path(run, n), batch.to_json())
    return config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(trainer_bench.PRESETS), default="tiny")
    for name in ("seq", "vocab", "batch", "micro", "layers"):
        ap.add_argument(f"--{name}", type=int)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--keep", help="keep the run dir here (default: a temporary one, removed)")
    args = ap.parse_args()
    p = trainer_bench.preset(args)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(args.keep or tmp).resolve()
        t = time.perf_counter()
        config = prepare(run, args, p)
        print(f"run dir ready in {time.perf_counter() - t:.1f}s: preset {args.preset}, {args.steps} steps of "
              f"{p['batch']} x {p['seq']} tokens", flush=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
               "-m", "slurmrl.runtime.trainer", "--config", str(config)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        t = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t
        log = [x for x in (proc.stdout + proc.stderr).splitlines() if "slurmrl: trainer" in x]
        for x in log[:8]:
            print(f"  {x}")
        if proc.returncode:
            print(f"the trainer exited {proc.returncode}:\n{proc.stderr[-3000:]}", file=sys.stderr)
            raise SystemExit(1)
        rows = [json.loads(x) for x in (run / "metrics" / "trainer.jsonl").read_text().splitlines() if x.strip()]
        print(f"{'step':>4} {'step s':>8} {'tok/s':>9} {'sync s':>7} {'tok/s w/ sync':>14} {'peak GiB':>9}")
        for r in rows:
            print(f"{r['step']:>4} {r['step_time_s']:>8.2f} {r['tokens_per_s']:>9.0f} {r['sync_s']:>7.2f} "
                  f"{r['tokens'] / (r['step_time_s'] + r['sync_s']):>14.0f} "
                  f"{r.get('cuda_mem_peak_gib', r.get('cpu_rss_peak_gib', float('nan'))):>9.2f}")
        steady = sorted(rows[1:] or rows, key=lambda r: r["step_time_s"])
        mid = steady[len(steady) // 2]
        print(f"median of steps 2..{len(rows)}: {mid['tokens_per_s']:.0f} tok/s, step {mid['step_time_s']:.2f}s, "
              f"sync {mid['sync_s']:.2f}s; the whole trainer process {wall:.0f}s (load, steps, last checkpoint)")


if __name__ == "__main__":
    main()
