"""A [benchmark] on the local Slurm cluster with real vLLM, vllm-router and vLLM's load generator.

recipes/inference-debug.toml (one server behind the router, to keep it short on a small machine)
with a tiny grid: two concurrencies, short prompts, a few requests each, then = "stop". The job
must COMPLETE once the benchmark has run every point through the router (with the job's secret),
leave one JSON per point with positive throughput and a summary, and `status` must show them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import read_ready
from slurmrl.runtime.fixtures.tiny_model import build as build_tiny

pytestmark = [pytest.mark.cluster, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parent.parent


def test_benchmark_runs_its_grid_through_the_router_and_the_job_completes(slurm_cluster, tmp_path):
    model = build_tiny(tmp_path / "tiny")
    r = slurm_cluster.slurmrl(
        "submit", str(ROOT / "recipes" / "inference-debug.toml"),
        "--set", f'model.path="{model}"', "--set", f'python.executable="{sys.executable}"',
        "--set", "inference.nodes=1", "--set", "slurm.grace_seconds=5", "--set", "model.max_model_len=128",
        "--set", "benchmark.concurrencies=[1, 2]", "--set", "benchmark.input_lens=[16]",
        "--set", "benchmark.output_lens=[8]", "--set", "benchmark.num_prompts=4",
        "--set", 'benchmark.then="stop"', "--set", "benchmark.timeout=600",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "inference-debug"
    job_id = json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]
    try:
        w = slurm_cluster.slurmrl("status", str(run_dir), "--watch", cwd=tmp_path, timeout=1200)
    finally:
        slurm_cluster.run(["scancel", job_id])  # a no-op once the job has ended
    logs = "\n".join(f"{f.name}: {f.read_text(errors='replace')[-3000:]}"
                     for f in sorted(RunDir(run_dir).log_dir(0).glob("*.log")))
    assert w.returncode == 0, w.stdout[-3000:] + w.stderr + logs  # COMPLETED

    summary = json.loads(RunDir(run_dir).benchmark_summary().read_text())
    assert summary["status"] == "done" and summary["error"] is None, summary
    assert summary["target"] == read_ready(RunDir(run_dir).ready_file(0, "router", 0))[0]  # through the router
    assert [(p["concurrency"], p["input_len"], p["output_len"]) for p in summary["points"]] == [(1, 16, 8), (2, 16, 8)]
    for p in summary["points"]:
        assert p["completed"] == 4 and p["failed"] == 0, p
        assert p["output_throughput"] > 0 and p["request_throughput"] > 0 and p["ttft_p50_ms"] > 0, p
        point = json.loads((RunDir(run_dir).benchmark_dir() / p["file"]).read_text())
        assert point["total_output_tokens"] == 4 * 8 and point["max_concurrency"] == p["concurrency"]
        assert "generated_texts" not in point
    assert RunDir(run_dir).benchmark_plot().stat().st_size > 0

    st = slurm_cluster.slurmrl("status", str(run_dir), cwd=tmp_path)
    assert "COMPLETED" in st.stdout and "benchmark: done, 2/2 point(s)" in st.stdout, st.stdout
    assert "out tok/s" in st.stdout and "TTFT p50/p99" in st.stdout, st.stdout
    js = json.loads(slurm_cluster.slurmrl("status", str(run_dir), "--json", cwd=tmp_path).stdout.splitlines()[-1])
    assert [p["concurrency"] for p in js["benchmark"]["points"]] == [1, 2]
    phases = [p["what"] for p in js["phases"]]
    assert any(w.startswith("benchmark done: 2 point(s)") for w in phases), phases
    left = slurm_cluster.wait_no_job_processes(job_id)
    assert not left, "left after the job:\n" + "\n".join(left)
