"""How fast do slurmrl's real inference components serve and reload? Prints figures; asserts nothing.

Runs on loopback, outside Slurm, through slurmrl's runtimes (tests/support/live_components.py): two
real vLLM (CPU build) servers with the tiny test model and the real vllm-router (round_robin).

1. Throughput: N requests x T completion tokens (ignore_eos), C at a time, sent straight to one
   replica vs through the router to two replicas; completion tokens/s, requests/s, ratio.
2. Weight reload: ``client.reload_weights`` of one server from a checkpoint folder vs a plain
   copy of the same safetensors bytes (copyfile + fsync); medians, ratio.

CPU-only numbers: they say how the pieces behave, not what a GPU node does.

    .venv/bin/python benchmarks/inference_bench.py [--requests 32 --tokens 64 --concurrency 16]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

from live_components import LiveComponent, free_port_base, post_json, serve_recipe  # noqa: E402


def machine() -> str:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    model = ""
    try:
        model = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{platform.machine()} {model}; os.cpu_count()={os.cpu_count()}, usable cores={affinity}, "
            f"load average {load}; python {platform.python_version()}")


def completed_requests(url: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return sum(float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)", text, re.M))


def load(url: str, requests: int, tokens: int, concurrency: int) -> dict:
    body = {"model": "tiny", "max_tokens": tokens, "temperature": 0, "ignore_eos": True}

    def one(i: int) -> int:
        out = post_json(f"{url}/v1/completions", {**body, "prompt": f"request {i}: count"}, timeout=600)
        return out["usage"]["completion_tokens"]

    with ThreadPoolExecutor(concurrency) as pool:
        t = time.perf_counter()
        done = list(pool.map(one, range(requests)))
        secs = time.perf_counter() - t
    return {"secs": secs, "tok_s": sum(done) / secs, "req_s": requests / secs, "tokens": sum(done)}


def best_of(url: str, args, reps: int) -> dict:
    runs = [load(url, args.requests, args.tokens, args.concurrency) for _ in range(reps)]
    return max(runs, key=lambda r: r["tok_s"])


def fsync_copy(src: Path, dst: Path) -> float:
    t = time.perf_counter()
    shutil.copyfile(src, dst)
    with open(dst, "rb+") as f:
        os.fsync(f.fileno())
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2, help="load runs per target (best is kept)")
    ap.add_argument("--reloads", type=int, default=7)
    args = ap.parse_args()

    from slurmrl.app.build import render
    from slurmrl.runtime.fixtures.tiny_model import build as build_tiny
    from slurmrl.runtime.vllm import client

    print(f"machine: {machine()}")
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="slurmrl-inference-bench-"))
    procs: list[LiveComponent] = []
    try:
        models = [build_tiny(tmp / "seed0", seed=0), build_tiny(tmp / "seed1", seed=1)]
        recipe = tmp / "bench.toml"
        recipe.write_text(serve_recipe(models[0], name="bench"))
        out = render(recipe, run_dir=tmp / "run")
        base = free_port_base()
        comps = out.run_dir / "components"
        urls = [f"http://127.0.0.1:{base + 16 + i}" for i in range(2)]
        router_url = f"http://127.0.0.1:{base}"

        # Outside Slurm both servers see every core, and vLLM's auto binding puts each one's OMP
        # threads on the first allowed core: core 0 for both. Give each its own core, as the
        # per-task cpusets of a Slurm step would.
        cores = sorted(os.sched_getaffinity(0))
        binds = [str(cores[i % len(cores)]) for i in range(2)]
        t = time.perf_counter()
        procs += [
            LiveComponent(comps / "inference.toml", out.run_dir, base, local=i,
                          extra_env={"VLLM_CPU_OMP_THREADS_BIND": binds[i]})
            for i in range(2)
        ]
        for proc, url in zip(procs, urls):
            proc.wait_http(f"{url}/health", timeout=600)
        print(f"two vLLM servers up in {time.perf_counter() - t:.1f} s (started together, enforce_eager, "
              f"float32, OMP threads on cores {binds})")
        t = time.perf_counter()
        router = LiveComponent(comps / "router.toml", out.run_dir, base)
        procs.append(router)
        router.wait_http(f"{router_url}/health", timeout=120)
        print(f"vllm-router (round_robin) up in {time.perf_counter() - t:.1f} s")

        for url in (*urls, router_url):  # warm-up: first requests pay one-off costs
            load(url, 4, 8, 4)

        print(f"\nthroughput: {args.requests} requests x {args.tokens} tokens (ignore_eos), "
              f"concurrency {args.concurrency}, best of {args.reps}")
        direct = best_of(urls[0], args, args.reps)
        before = [completed_requests(u) for u in urls]
        routed = best_of(router_url, args, args.reps)
        spread = [completed_requests(u) - b for u, b in zip(urls, before)]
        for name, r in (("one replica, direct", direct), ("router -> two replicas", routed)):
            print(f"  {name:24s} {r['tok_s']:8.0f} tok/s  {r['req_s']:6.2f} req/s  ({r['secs']:.2f} s)")
        print(f"  requests per replica through the router: {[int(x) for x in spread]}")
        print(f"  ratio router/direct: {routed['tok_s'] / direct['tok_s']:.2f}x tok/s")

        size = sum(p.stat().st_size for p in models[1].glob("*.safetensors"))
        print(f"\nweight reload of one server ({size / 1e6:.2f} MB safetensors), median of {args.reloads}")
        reloads = []
        for i in range(args.reloads):
            reloads.append(client.reload_weights([urls[0]], str(models[(i + 1) % 2]))[urls[0]])
        if args.reloads % 2:
            client.reload_weights([urls[0]], str(models[0]))
        copies = []
        src = next(models[1].glob("*.safetensors"))
        for _ in range(args.reloads):
            with tempfile.NamedTemporaryFile(dir=tmp, suffix=".safetensors") as dst:
                copies.append(fsync_copy(src, Path(dst.name)))
        reload_s, copy_s = statistics.median(reloads), statistics.median(copies)
        print(f"  client.reload_weights (pause, collective_rpc reload, reset cache, resume): {reload_s * 1e3:8.1f} ms"
              f"  (min {min(reloads) * 1e3:.1f}, max {max(reloads) * 1e3:.1f})")
        print(f"  copyfile + fsync of the same bytes:                                     {copy_s * 1e3:8.1f} ms"
              f"  (min {min(copies) * 1e3:.1f}, max {max(copies) * 1e3:.1f})")
        print(f"  ratio reload/copy: {reload_s / copy_s:.1f}x")
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
