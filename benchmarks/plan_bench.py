"""How fast is planning? Prints figures; asserts nothing.

1. `slurmrl plan` as a whole process (interpreter start + imports + plan + summary) on the
   largest recipe in recipes/, median of several runs.
2. plan + render (script, plan.json, component configs, in memory) of a generated
   1024-node P/D recipe: 512 prefill nodes (4 servers of tp=2 each) + 512 decode nodes (tp=8).

    .venv/bin/python benchmarks/plan_bench.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

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
    from slurmrl.render import build

    sizes = {p: len(build(p, run_dir=f"/bench/{p.stem}").files) for p in sorted((ROOT / "recipes").glob("*.toml"))}
    return max(sizes, key=lambda p: (sum(g.nodes for g in build(p, run_dir="/b").plan.groups), sizes[p]))


def plan_process(recipe: Path, runs: int = 7) -> list[float]:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "slurmrl", "plan", str(recipe)], check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return times


def big_pd() -> tuple[float, float, float, int, int]:
    from slurmrl.plan import plan
    from slurmrl.recipe.load import load_recipe
    from slurmrl.render import build

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "pd-1024.toml"
        path.write_text(BIG_PD)
        t0 = time.perf_counter()
        recipe = load_recipe(path)
        t1 = time.perf_counter()
        p = plan(recipe, "/bench/pd-1024")
        t2 = time.perf_counter()
        out = build(path, run_dir="/bench/pd-1024")  # load + plan + render everything
        t3 = time.perf_counter()
    size = sum(len(v) for v in out.files.values())
    return t1 - t0, t2 - t1, t3 - t2, size, len(p.components[0].instances) + len(p.components[1].instances)


def main() -> None:
    recipe = largest_recipe()
    times = plan_process(recipe)
    print(f"slurmrl plan {recipe.relative_to(ROOT)} (whole process, {len(times)} runs): "
          f"median {statistics.median(times) * 1000:.0f} ms, min {min(times) * 1000:.0f} ms")
    load_s, plan_s, build_s, size, servers = big_pd()
    print(f"1024-node P/D ({servers} vLLM servers): load {load_s * 1000:.0f} ms, plan {plan_s * 1000:.0f} ms, "
          f"load+plan+render {build_s * 1000:.0f} ms, {size / 1e6:.1f} MB of run-dir text")


if __name__ == "__main__":
    main()
