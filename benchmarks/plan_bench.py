"""How fast is planning? Prints figures; asserts nothing.

1. `slurmrl plan` as a whole process (interpreter start + imports + load + plan + summary), paired
   with `python -c pass` in the same loop (runs interleaved, so load on the machine hits both
   alike): the median of each, and their ratio. Two recipes: the largest in recipes/ (most nodes,
   then most components) and a generated 1024-node P/D recipe: 512 prefill nodes (4 servers of
   tp=2 each) + 512 decode nodes (tp=8). Twice: in this environment as it is, and with bytecode
   cached (where PYTHONDONTWRITEBYTECODE is set, as in some sandboxes, Python compiles slurmrl's
   sources on every run; an installed package, or any second run elsewhere, reads .pyc files).
2. Every gallery recipe (slurmrl/recipes/*.toml): `slurmrl plan` wall time (min and median of
   ``--repeat`` runs) and the process's CPU time (user + system, min), both ways of bytecode. On a
   shared machine the minimum is the figure to compare; the load average is printed before and after.
3. Where the time of one `slurmrl plan` goes: ``-X importtime``, the imports that took longest (the
   minimum over runs of each module's own time, and of the top-level imports with what they pulled in).
4. In one process, the 1024-node recipe: load, plan, summary, and load+plan+render (script,
   plan.json, component configs, in memory).
0. With ``--against REF`` (a git commit, branch or tag), first: this tree's `slurmrl plan RECIPE` against
   REF's (its files from ``git archive`` in a temporary folder, run with the same Python and venv), taken in
   turns in one loop so the machine's load hits both alike: CPU time of the process (user + system) and
   wall time, min and median of ``--repeat`` runs each, with bytecode cached and with none; and whether
   the two print the same plan. ``--against REF --compare-only`` stops there (about 30 s).

    .venv/bin/python benchmarks/plan_bench.py [--repeat N] [--top K] [--only RECIPE ...]
    .venv/bin/python benchmarks/plan_bench.py --against main --compare-only [--recipe recipes/rl-debug.toml]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
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


def timed(argv: list[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child: user + system) of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, cwd=cwd, env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def per_recipe(recipes: list[Path], runs: int, env: dict[str, str]) -> None:
    """One line per recipe: wall min and median, CPU min, over ``runs`` runs (taken in turns)."""
    walls: dict[Path, list[float]] = {r: [] for r in recipes}
    cpus: dict[Path, list[float]] = {r: [] for r in recipes}
    for r in recipes:  # warm-up (bytecode written, files in the page cache)
        timed([sys.executable, "-m", "slurmrl", "plan", str(r)], env)
    for _ in range(runs):
        for r in recipes:
            wall, cpu = timed([sys.executable, "-m", "slurmrl", "plan", str(r)], env)
            walls[r].append(wall)
            cpus[r].append(cpu)
    for r in recipes:
        print(f"  {r.name:32s} wall min {min(walls[r]) * 1000:4.0f} ms  median {statistics.median(walls[r]) * 1000:4.0f} ms"
              f"  cpu min {min(cpus[r]) * 1000:4.0f} ms")
    best = [min(w) for w in walls.values()]
    print(f"  {'all recipes':32s} wall min of mins {min(best) * 1000:4.0f} ms, max of mins {max(best) * 1000:4.0f} ms")


def against(ref: str, recipe: str, runs: int, env: dict[str, str]) -> None:
    """Part 0: `slurmrl plan RECIPE` of this tree and of ``ref``'s, in turns, both ways of bytecode."""
    with tempfile.TemporaryDirectory() as d:
        old = Path(d) / "old"
        old.mkdir()
        archive = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        trees = {f"{ref} (old)": old, "this tree (new)": ROOT}
        outputs = {name: plan_output(tree, recipe, env) for name, tree in trees.items()}
        same = len(set(outputs.values())) == 1
        print(f"`slurmrl plan {recipe}`: {ref} against this tree, {runs} runs each in turns; "
              f"output {'identical' if same else 'DIFFERS'}")
        cached = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
        cached["PYTHONPYCACHEPREFIX"] = str(Path(d) / "pycache")  # each tree's bytecode, by its own path
        # bytecode looked for in an empty folder and never written: every source compiled on every run
        uncached = {**env, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(Path(d) / "none")}
        for how, e in (("bytecode cached", cached), ("no bytecode (every source compiled on every run)", uncached)):
            cpu, wall = turns(trees, recipe, runs, e)
            print(f"  {how}:")
            for name in trees:
                print(f"    {name:28s} cpu min {min(cpu[name]) * 1000:4.0f} ms  median "
                      f"{statistics.median(cpu[name]) * 1000:4.0f} ms   wall min {min(wall[name]) * 1000:4.0f} ms  "
                      f"median {statistics.median(wall[name]) * 1000:4.0f} ms")
            first, second = (min(cpu[name]) for name in trees)
            print(f"    new/old, CPU min: {second / first:.2f}")
        shutil.rmtree(old)


def plan_output(tree: Path, recipe: str, env: dict[str, str]) -> str:
    """What `slurmrl plan` prints with ``tree``'s slurmrl (the run dir's path left out: it is the tree's own)."""
    out = subprocess.run([sys.executable, "-m", "slurmrl", "plan", recipe, "--run-dir", "/bench/run"], cwd=tree,
                         env={**env, "PYTHONPATH": str(tree)}, check=True, capture_output=True, text=True)
    return out.stdout


def turns(trees: dict[str, Path], recipe: str, runs: int, env: dict[str, str]) -> tuple[dict, dict]:
    """(CPU seconds, wall seconds) per tree, ``runs`` each, taken in turns (order swapped every round)."""
    cpu: dict[str, list[float]] = {name: [] for name in trees}
    wall: dict[str, list[float]] = {name: [] for name in trees}
    names = list(trees)
    for name in names:  # warm-up: bytecode written, files in the page cache
        timed([sys.executable, "-m", "slurmrl", "plan", recipe], {**env, "PYTHONPATH": str(trees[name])}, trees[name])
    for i in range(runs):
        for name in names[i % 2:] + names[: i % 2]:
            w, c = timed([sys.executable, "-m", "slurmrl", "plan", recipe], {**env, "PYTHONPATH": str(trees[name])},
                         trees[name])
            cpu[name].append(c)
            wall[name].append(w)
    return cpu, wall


IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def import_times(recipe: Path, runs: int, top: int, env: dict[str, str]) -> None:
    """``-X importtime`` of `slurmrl plan RECIPE`: the ``top`` modules by own time and the top-level imports
    by cumulative time, each the minimum over ``runs`` runs (microseconds as Python reports them)."""
    own: dict[str, int] = {}
    cumulative: dict[str, int] = {}
    for _ in range(runs):
        err = subprocess.run([sys.executable, "-X", "importtime", "-m", "slurmrl", "plan", str(recipe)], check=True,
                             capture_output=True, text=True, cwd=ROOT, env=env).stderr
        for m in IMPORT_LINE.finditer(err):
            name, indent = m.group(4), len(m.group(3))
            own[name] = min(own.get(name, 1 << 62), int(m.group(1)))
            if indent == 1:
                cumulative[name] = min(cumulative.get(name, 1 << 62), int(m.group(2)))
    print(f"  all imports, own times summed: {sum(own.values()) / 1000:.0f} ms over {len(own)} modules")
    print("  top-level imports (with what they import): " + ", ".join(
        f"{n} {us / 1000:.0f}" for n, us in sorted(cumulative.items(), key=lambda x: -x[1])[:top]) + " (ms)")
    print("  modules by own time: " + ", ".join(
        f"{n} {us / 1000:.1f}" for n, us in sorted(own.items(), key=lambda x: -x[1])[:top]) + " (ms)")


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description="How fast is `slurmrl plan`? (prints figures, asserts nothing)")
    ap.add_argument("runs", nargs="?", type=int, help=argparse.SUPPRESS)  # the old positional RUNS
    ap.add_argument("--repeat", type=int, default=RUNS, help=f"runs per measurement (default {RUNS}); take minimums")
    ap.add_argument("--top", type=int, default=12, help="imports to list (default 12)")
    ap.add_argument("--only", nargs="*", metavar="RECIPE", help="gallery recipes (stems) for part 2; default all")
    ap.add_argument("--against", metavar="REF", help="first compare `slurmrl plan` with this git ref's, in turns")
    ap.add_argument("--recipe", default="recipes/rl-debug.toml", help="the recipe --against plans (default %(default)s)")
    ap.add_argument("--compare-only", action="store_true", help="with --against: stop after the comparison")
    args = ap.parse_args()
    runs = args.runs or args.repeat
    print(f"load average before: {load_average()} ({os.cpu_count()} CPUs)")
    if args.against:
        against(args.against, args.recipe, runs, dict(os.environ))
        if args.compare_only:
            print(f"load average after: {load_average()}")
            return
    recipe = largest_recipe()
    gallery = sorted((ROOT / "slurmrl" / "recipes").glob("*.toml"))
    if args.only:
        gallery = [g for g in gallery if g.stem in args.only]
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
        as_is = f"environment as it is (PYTHONDONTWRITEBYTECODE={env.get('PYTHONDONTWRITEBYTECODE', '')!r})"
        report(f"{what}, {as_is}:", paired(commands, runs, env))
        cached = dict(env)
        cached.pop("PYTHONDONTWRITEBYTECODE", None)
        cached["PYTHONPYCACHEPREFIX"] = str(Path(d) / "pycache")  # bytecode outside the source tree
        report(f"{what}, bytecode cached:", paired(commands, runs, cached))
        print(f"every gallery recipe, `slurmrl plan`, {runs} runs each, {as_is}:")
        per_recipe(gallery, runs, env)
        print(f"every gallery recipe, `slurmrl plan`, {runs} runs each, bytecode cached:")
        per_recipe(gallery, runs, cached)
        print(f"where the time goes: -X importtime of `slurmrl plan {gallery[0].name}`, bytecode cached, min of "
              f"{min(runs, 5)} runs:")
        import_times(gallery[0], min(runs, 5), args.top, cached)
        steps, mb = in_process(big)
    print("1024-node P/D in one process: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in steps.items())
          + f"; {mb:.1f} MB of run-dir text")
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
