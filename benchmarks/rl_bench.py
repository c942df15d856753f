"""Asynchronous vs synchronous RL on the local Slurm cluster: samples per second, same recipe.

Runs recipes/rl-debug.toml twice, with orchestrator.max_off_policy_steps = 1 (generation of step
n+1 overlaps training of step n) and = 0 (synchronous), and prints samples/s over the steady
part of each run (from the end of step 2 to the last step), the mean off-policy lag, and the
ratio. Prints figures; asserts nothing. Needs root (the local cluster) and ~10 minutes.

    .venv/bin/python benchmarks/rl_bench.py [--steps 16]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurmrl.app.job_outputs import read_typed
from slurmrl.contract.metrics import OrchestratorRow

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def sh(*args: str, env: dict, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, cwd=cwd, check=check, capture_output=True, text=True)


def cluster_env() -> dict:
    import os

    from slurmrl.localcluster import cluster_env as vars_for

    subprocess.run([PY, "-m", "slurmrl.localcluster", "up"], check=True, capture_output=True)
    state = Path(os.environ.get("SLURMRL_CLUSTER_DIR", Path.home() / ".cache/slurmrl/cluster"))
    return {**os.environ, **vars_for(state)}


def run(mode: int, steps: int, model: Path, env: dict, work: Path) -> dict:
    cwd = work / f"off{mode}"
    cwd.mkdir()
    sh(PY, "-m", "slurmrl", "submit", str(ROOT / "recipes" / "rl-debug.toml"),
       "--set", f'model.path="{model}"', "--set", f'python.executable="{PY}"',
       "--set", f"trainer.max_steps={steps}", "--set", f"orchestrator.max_off_policy_steps={mode}",
       env=env, cwd=cwd)
    run_dir = cwd / "runs" / "rl-debug"
    t = time.perf_counter()
    done = sh(PY, "-m", "slurmrl", "status", str(run_dir), "--watch", env=env, cwd=cwd, check=False)
    wall = time.perf_counter() - t
    recs = list(read_typed(OrchestratorRow.from_json, run_dir / "metrics" / "orchestrator.jsonl").values())
    steady = [r for r in recs if r.step > 2]
    span = (recs[-1].time or 0.0) - (next(r for r in recs if r.step == 2).time or 0.0)
    return {
        "completed": done.returncode == 0, "wall_s": wall,
        "samples_per_s": sum(r.samples or 0 for r in steady) / span if span > 0 else float("nan"),
        "mean_lag": sum(r.off_policy_lag or 0 for r in steady) / len(steady),
        "mean_wait_s": sum(r.wait_s or 0.0 for r in steady) / len(steady),
        "reward_last": recs[-1].reward_mean,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=16)
    args = ap.parse_args()
    from slurmrl.runtime.fixtures.tiny_model import build

    env = cluster_env()
    with tempfile.TemporaryDirectory(dir=ROOT / "runs" if (ROOT / "runs").exists() else None) as d:
        work = Path(d)
        model = build(work / "tiny")
        results = {mode: run(mode, args.steps, model, env, work) for mode in (1, 0)}
    for mode, r in results.items():
        name = "async (max_off_policy_steps=1)" if mode else "sync  (max_off_policy_steps=0)"
        print(f"{name}: {r['samples_per_s']:.2f} samples/s, mean off-policy lag {r['mean_lag']:.2f}, "
              f"mean orchestrator wait {r['mean_wait_s']:.2f}s/step, job wall {r['wall_s']:.0f}s, "
              f"completed={r['completed']}")
    print(f"async / sync samples/s: {results[1]['samples_per_s'] / results[0]['samples_per_s']:.2f}x")


if __name__ == "__main__":
    main()
