"""How fast is planning? Prints figures; asserts nothing.

1. `slurmrl plan` as a whole process (interpreter start + imports + load + plan + summary), paired
   with `python -c pass` in the same loop (runs interleaved, so load on the machine hits both
   alike): the median of each, and their ratio. Two recipes: the largest in recipes/ (most nodes,
   then most components) and a generated 1024-node P/D recipe: 512 prefill nodes (4 servers of
   tp=2 each) + 512 decode nodes (tp=8). Twice: in this environment as it is, and with bytecode
   cached (where PYTHONDONTWRITEBYTECODE is set, as in some sandboxes, Python compiles slurmrl's
   sources on every run; an installed package, or any second run elsewhere, reads .pyc files).
2. In one process, the 1024-node recipe: load, plan, summary, and load+plan+render (script,
   plan.json, component configs, in memory).

    .venv/bin/python benchmarks/plan_bench.py [RUNS]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = 15

BIG_PD = """
name = "pd-1024"
kind = "inference"
[slurm]
partition = "gpu"
gpus_per_node = 8
cpus_per_node = 96
[model]
path = "deepseek-ai/DeepSeek-V3"
[inference]
mode = "pd"
[inference.prefill]
replicas = 2048
tp = 2
nodes = 512
[inference.decode]
replicas = 512
tp = 8
nodes = 512
"""


def largest_recipe() -> Path:
    from slurmrl.app.plan import planned

    def size(path: Path) -> tuple[int, int]:
        p = planned(path, run_dir=f"/bench/{path.stem}")[1]
        return sum(g.nodes for g in p.groups), len(p.components)

    return max(sorted((ROOT / "recipes").glob("*.toml")), key=size)


def paired(commands: dict[str, list[str]], runs: int, env: dict[str, str]) -> dict[str, list[float]]:
    """Each command once per round, in a rotating order; seconds per run (after one warm-up)."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    names = list(commands)
    for argv in commands.values():
        subprocess.run(argv, check=True, capture_output=True, cwd=ROOT, env=env)
    for i in range(runs):
        for name in names[i % len(names):] + names[: i % len(names)]:
            t = time.perf_counter()
            subprocess.run(commands[name], check=True, capture_output=True, cwd=ROOT, env=env)
            times[name].append(time.perf_counter() - t)
    return times


def report(title: str, times: dict[str, list[float]]) -> None:
    base = statistics.median(times["python -c pass"])
    print(title)
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:45s} {med * 1000:5.0f} ms  (min {min(ts) * 1000:4.0f} ms)  x{med / base:.1f}")


def in_process(path: Path) -> tuple[dict[str, float], float]:
    """Seconds per step, and megabytes of run-dir text."""
    from slurmrl.app.build import build
    from slurmrl.plan import plan
    from slurmrl.recipe.load import load_recipe
    from slurmrl.render.summary import summary

    t0 = time.perf_counter()
    recipe = load_recipe(path)
    t1 = time.perf_counter()
    p = plan(recipe, "/bench/pd-1024")
    t2 = time.perf_counter()
    summary(p, Path("/bench/pd-1024"))
    t3 = time.perf_counter()
    out = build(path, run_dir="/bench/pd-1024")  # load + plan + render everything
    t4 = time.perf_counter()
    steps = {"load": t1 - t0, "plan": t2 - t1, "summary": t3 - t2, "load+plan+render": t4 - t3}
    return steps, sum(len(v) for v in out.files.values()) / 1e6


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else RUNS
    recipe = largest_recipe()
    with tempfile.TemporaryDirectory() as d:
        big = Path(d) / "pd-1024.toml"
        big.write_text(BIG_PD)
        py = [sys.executable]
        commands = {
            "python -c pass": py + ["-c", "pass"],
            f"slurmrl plan {recipe.relative_to(ROOT)}": py + ["-m", "slurmrl", "plan", str(recipe)],
            "slurmrl plan pd-1024.toml (1024 nodes)": py + ["-m", "slurmrl", "plan", str(big)],
        }
        what = f"whole process, {runs} paired runs (median, min; ratio of medians to `python -c pass`)"
        env = dict(os.environ)
        report(f"{what}, environment as it is (PYTHONDONTWRITEBYTECODE={env.get('PYTHONDONTWRITEBYTECODE', '')!r}):",
               paired(commands, runs, env))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(Path(d) / "pycache")  # bytecode outside the source tree
        report(f"{what}, bytecode cached:", paired(commands, runs, env))
        steps, mb = in_process(big)
    print("1024-node P/D in one process: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in steps.items())
          + f"; {mb:.1f} MB of run-dir text")


if __name__ == "__main__":
    main()
