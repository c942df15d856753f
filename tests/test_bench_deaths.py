"""The benchmark and a server's death (slurmrl.runtime.bench.deaths): failed requests that a server's death
during the point explains (at most the concurrency cap per death) do not fail it; more, or without a death,
do. The runner runs in a run dir whose events.jsonl is real; vLLM's load generator is a test double
(``runner``), the cluster test (tests/test_restart_cluster.py) runs the real one through a real kill."""

from __future__ import annotations

import json
import time

import pytest

from slurmrl.contract import events
from slurmrl.runtime.bench import deaths
from slurmrl.runtime.bench import runner as bench


def result(n: int, failed: int) -> dict:
    """vLLM's result of one point with ``failed`` of ``n`` requests failed (--save-detailed lists)."""
    return {"num_prompts": n, "completed": n - failed, "failed": failed, "duration": 1.0, "request_throughput": 1.0,
            "output_throughput": 8.0, "total_token_throughput": 16.0, "start_times": [100.0 + k for k in range(n)],
            "latencies": [0.0] * failed + [0.5] * (n - failed), "errors": ["cut"] * failed + [""] * (n - failed)}


@pytest.fixture
def job(tmp_path, monkeypatch):
    """A run dir as a job script exports it; returns its events file."""
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setenv("SLURMRL_RUN_DIR", str(run))
    monkeypatch.setattr(bench, "check_endpoint", lambda *a, **k: None)
    monkeypatch.setattr(deaths, "WAIT_S", 0.0)
    return run / "events.jsonl"


def run(tmp_path, failed: int) -> tuple[int, dict]:
    args, vllm_args = bench.parse(["--out", str(tmp_path / "benchmark"), "--concurrencies", "2", "--input-lens", "8",
                                   "--output-lens", "4", "--", "--base-url", "http://front:1", "--num-prompts", "6"])
    rc = bench.run(args, vllm_args, runner=lambda argv: result(6, failed))
    return rc, json.loads((tmp_path / "benchmark" / "summary.json").read_text())


def test_failures_a_death_explains_do_not_fail_the_benchmark(tmp_path, job):
    events.append(job, events.Event("died", "inference", 1, "n1", "exited with code 137", 0, "7", time=time.time() + 1))
    rc, s = run(tmp_path, failed=2)
    assert rc == 0 and s["status"] == "done" and s["error"] is None, s
    p = s["points"][0]
    assert (p["failed"], p["deaths"], p["failed_with_deaths"]) == (2, 1, 2)
    point = json.loads((tmp_path / "benchmark" / p["file"]).read_text())
    assert point["requests"][:3] == [[100.0, 0.0, False], [101.0, 0.0, False], [102.0, 0.5, True]]


def test_more_failures_than_the_cap_per_death_fail_it(tmp_path, job):
    events.append(job, events.Event("died", "inference", 1, "n1", "exited with code 137", 0, "7", time=time.time() + 1))
    rc, s = run(tmp_path, failed=3)  # a cap of 2: one death cuts at most 2 requests
    assert rc == 1 and s["status"] == "failed" and s["error"] == "in 1 of 1 point(s): 1 request(s) failed (first: cut)"
    assert s["points"][0]["failed_with_deaths"] == 2


def test_failures_without_a_death_during_the_point_fail_it(tmp_path, job):
    events.append(job, events.Event("died", "inference", 1, "n1", "an older death", 0, "7", time=time.time() - 60))
    rc, s = run(tmp_path, failed=1)
    assert rc == 1 and s["points"][0]["deaths"] == 0 and s["points"][0]["failed_with_deaths"] == 0, s
