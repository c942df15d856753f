"""Benchmark recipes in memory, the validation error they raise, and recorded results; shared by the
benchmark tests."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from planner_jobs import make

from slurmrl import cli
from slurmrl.runtime.bench import runner as bench

ROOT = Path(__file__).resolve().parents[2]


def inference(benchmark: dict | None = None, nodes: int = 2, **inf) -> dict:
    """An inference job on nodes of 4 GPUs and 8 CPUs, one GPU per server (the local cluster's shape)."""
    d = make("inference", gpus=4, cpus=8, inference={"nodes": nodes, "gpus_per_node": 1, **inf})
    d["slurm"]["time"] = "02:00:00"
    if benchmark is not None:
        d["benchmark"] = benchmark
    return d


def validate_err(*sets: str, recipe: str = "inference-debug") -> str:
    out, err = io.StringIO(), io.StringIO()
    argv = ["validate", str(ROOT / "recipes" / f"{recipe}.toml")]
    for s in sets:
        argv += ["--set", s]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    assert rc == 2 and out.getvalue() == "", (sets, rc, err.getvalue())
    assert len(err.getvalue().splitlines()) == 1, err.getvalue()
    return err.getvalue()


def fake_result(c: int, i: int, o: int, n: int = 8, failed: int = 0, error: str = "") -> dict:
    return {
        "num_prompts": n, "completed": n - failed, "failed": failed, "duration": 2.0,
        "request_throughput": c * 1.5, "output_throughput": c * o * 1.5, "total_token_throughput": c * (i + o) * 1.5,
        "max_concurrency": c, "total_output_tokens": (n - failed) * o,
        "median_ttft_ms": 10.0 * c, "p99_ttft_ms": 20.0 * c, "median_tpot_ms": 1.0, "p99_tpot_ms": 2.0,
        "median_itl_ms": 1.0, "p99_itl_ms": 3.0, "median_e2el_ms": 30.0, "p99_e2el_ms": 50.0,
        "ttfts": [0.01] * n, "generated_texts": ["x" * o] * n, "errors": [error] * failed + [""] * (n - failed),
    }


def per_point(fn):
    """A runner: vLLM's argv -> fn(concurrency, input len, output len)."""
    calls = []

    def runner(argv):
        c, i, o = (int(bench.value_after(argv, f)) for f in ("--max-concurrency", "--input-len", "--output-len"))
        calls.append((c, i, o))
        return fn(c, i, o)

    runner.calls = calls
    return runner
