"""Issue 27 item 1, the display half: what the runtime writes (null memory fields, NaN and infinite
rewards and losses, huge numbers, a partial last line, an empty file) is shown as such by
`slurmrl status` and `slurmrl plot`, never a crash; a benchmark summary with null numbers too."""

from __future__ import annotations

import json
import math

import pytest

from slurmrl import cli
from slurmrl.app.job_outputs import latest_metrics, typed
from slurmrl.app.plot import training_line
from slurmrl.app.status_read import latest_training
from slurmrl.app.status_text import benchmark_lines, training_lines
from slurmrl.contract.metrics import OrchestratorRow, TrainerRow

NAN, INF = float("nan"), float("inf")

ORCH = [{"step": 1, "reward_mean": 0.25, "reward_std": None, "reward_min": -INF, "reward_max": INF,
         "off_policy_lag": None},
        {"step": 2, "reward_mean": NAN, "reward_std": NAN, "off_policy_lag": 1},
        {"step": 3, "reward_mean": 1e308 * 10, "reward_std": 10**40},
        {"step": 4, "reward_mean": 0.75, "reward_std": 0.1, "off_policy_lag": 2}]
TRAINER = [{"step": 1, "loss": NAN, "kl": INF, "entropy": None, "cuda_mem_peak_gib": 3.5,
            "cuda_mem_reserved_gib": None, "mfu": NAN, "tokens_per_s": None},
           {"step": 2, "loss": 0.5, "kl": -INF, "cuda_mem_peak_gib": None, "cpu_rss_gib": None, "mfu": None,
            "tokens_per_s": INF}]


def write(run, role, rows, tail=""):
    (run / "metrics").mkdir(parents=True, exist_ok=True)
    (run / "metrics" / f"{role}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


@pytest.mark.parametrize("orch", [ORCH[0], ORCH[1], ORCH[2], None])
@pytest.mark.parametrize("trainer", [TRAINER[0], TRAINER[1], {"step": 0}, None])
def test_training_line_shows_null_nan_and_inf(orch, trainer):
    line = training_line(typed(OrchestratorRow.from_json, orch), typed(TrainerRow.from_json, trainer))
    if orch is None and trainer is None:
        assert line is None
        return
    if orch is ORCH[1]:
        assert "reward nan" in line
    if orch is ORCH[2]:
        assert "reward inf" in line
    if trainer is TRAINER[0]:
        assert "loss nan" in line and "kl inf" in line and "cuda peak 3.5 GiB (reserved -)" in line


def test_status_and_plot_with_runtime_values(tmp_path, capsys):
    run = tmp_path / "run"
    write(run, "orchestrator", ORCH, tail='{"step": 5, "reward_me')  # cut by a kill
    write(run, "trainer", TRAINER)
    lines = training_lines(latest_training(run))
    assert lines[1].startswith("  latest batch 4: reward 0.750") and "trainer step 2: loss 0.5, kl -inf" in lines[1]
    assert cli.main(["plot", str(run)]) == 0
    out = capsys.readouterr().out
    assert "step 1 .. 4" in out  # steps 2 and 3 (NaN, inf) are not on the curve; the plot still draws
    assert (run / "reward.png").stat().st_size > 0


def test_plot_of_a_run_whose_every_reward_is_nan(tmp_path, capsys):
    run = tmp_path / "run"
    write(run, "orchestrator", [{"step": 1, "reward_mean": NAN}, {"step": 2, "reward_mean": None}])
    assert cli.main(["plot", str(run)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "no steps yet" in err


def test_empty_metrics_files(tmp_path, capsys):
    run = tmp_path / "run"
    write(run, "orchestrator", [])
    write(run, "trainer", [])
    assert latest_training(run) is None and latest_metrics(run) is None
    assert cli.main(["plot", str(run)]) == 2
    assert "no steps yet" in capsys.readouterr().err


def test_sweep_status_metric_of_nan_and_huge(tmp_path):
    run = tmp_path / "run"
    write(run, "orchestrator", [{"step": 1, "reward_mean": NAN}])
    got = latest_metrics(run)
    assert got["step"] == 1 and math.isnan(got["reward"])
    write(run, "orchestrator", [{"step": 2, "reward_mean": 10**40}])
    assert latest_metrics(run) == {"step": 2, "reward": 10**40}


def test_binary_metrics_are_one_line_naming_the_file(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    (run / "metrics" / "orchestrator.jsonl").write_bytes(b"\xff\xfe\x00garbage\n")
    assert cli.main(["plot", str(run)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "orchestrator.jsonl" in err and "UTF-8" in err


def test_benchmark_summary_with_null_and_nan_numbers(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "benchmark").mkdir(parents=True)
    summary = {"status": "failed", "target": "http://n1:8000", "planned_points": 2, "error": "all requests failed",
               "points": [{"concurrency": 1, "input_len": 8, "output_len": 8, "request_throughput": None,
                           "output_throughput": NAN, "ttft_p50_ms": INF, "failed": 4, "num_prompts": 4}]}
    (run / "benchmark" / "summary.json").write_text(json.dumps(summary))
    assert cli.main(["plot", str(run)]) == 0
    out = capsys.readouterr().out
    assert "benchmark: failed, 1/2 point(s)" in out and "4/4" in out
    from slurmrl.app.job_outputs import read_benchmark

    lines = benchmark_lines(read_benchmark(run))
    assert "error: all requests failed" in lines[-1]


@pytest.mark.parametrize("summary", [[], {"status": "done"}, {"status": "weird", "points": []},
                                     {"status": "done", "points": [1]},
                                     {"status": "done", "points": [{"concurrency": "x"}]},
                                     {"status": "done", "points": [{"ttft_p50_ms": "fast"}]},
                                     {"status": "done", "points": [], "target": "a\nb"}])
def test_a_hand_edited_benchmark_summary_is_one_line(tmp_path, capsys, summary):
    run = tmp_path / "run"
    (run / "benchmark").mkdir(parents=True)
    (run / "benchmark" / "summary.json").write_text(json.dumps(summary))
    assert cli.main(["plot", str(run)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "summary.json" in err
