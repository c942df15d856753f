"""Numbers the runtime wrote, read back (issue 43): a benchmark summary's points as `status`, `plot` and
`report` read them (slurmrl.rundir.benchmark). Only finite values in their range are kept; the rest
(null, NaN, infinities, integers beyond a float, a concurrency of 0 or below, a negative latency, a
share above 1) are read as missing: shown as '-', not drawn, never a crash. Metric rows
(slurmrl.rundir.metrics) likewise: an integer beyond a float, anywhere in a record, is missing."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmrl import charts, cli
from slurmrl.app import report_data as rd
from slurmrl.app.plot import training_line
from slurmrl.app.report import bench_panels, training_panels
from slurmrl.app.status_text import benchmark_lines
from slurmrl.contract.bench_summary import EXACT, WHOLE, in_range
from slurmrl.contract.metrics import OrchestratorRow, TrainerRow
from slurmrl.rundir import metrics
from slurmrl.rundir.benchmark import read_summary
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.strict_json import dumps

EXTREMES = st.one_of(
    st.integers(-(10 ** 400), 10 ** 400), st.sampled_from([0, -1, 1, 2 ** 53, 2 ** 53 + 1, 2 ** 63, 10 ** 309, -(10 ** 309)]),
    st.floats(), st.sampled_from([math.nan, math.inf, -math.inf, 1.7976931348623157e308, -0.0, 5e-324]), st.none())
KEYS = ["concurrency", "input_len", "output_len", "num_prompts", "completed", "failed", "output_throughput",
        "request_throughput", "total_token_throughput", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms",
        "request_goodput", "good_share"]
POINT = st.fixed_dictionaries({}, optional={k: EXTREMES for k in KEYS})
MANY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def write_summary(d: Path, points: list[dict], planned) -> None:
    (d / "benchmark").mkdir(parents=True, exist_ok=True)
    (d / "job.sbatch").write_text("#!/bin/bash\n")
    data = {"status": "done", "target": "http://n1:8000", "planned_points": planned, "points": points}
    (d / "benchmark" / "summary.json").write_text(json.dumps(data))  # Python writes NaN, inf and big integers


def kept_in_range(key: str, value) -> bool:
    return value is None or in_range(key, value) is not None


@MANY
@given(points=st.lists(POINT, max_size=5), planned=st.one_of(st.none(), st.integers(0, 10 ** 400)))
def test_every_number_read_back_is_finite_in_range_or_missing(tmp_path_factory, points, planned):
    d = tmp_path_factory.mktemp("b")
    write_summary(d, points, planned)
    summary = read_summary(d)
    assert summary is not None and len(summary.points) == len(points)
    for written, read in zip(points, summary.points):
        for key, value in read.items():
            if key in WHOLE:
                assert value is None or (isinstance(value, int) and WHOLE[key] <= value <= EXACT), (key, value)
            elif key in KEYS:
                assert value is None or (math.isfinite(float(value)) and value >= 0), (key, value)
            if value is not None:
                assert value == written[key]  # what is kept is what was written
    assert summary.planned_points is None or summary.planned_points <= EXACT
    json.loads(dumps(summary.to_json()))  # status --json: valid JSON
    rows = charts.benchmark_rows(summary)
    assert all(isinstance(c, str) and len(c) < 80 for row in rows for c in row)
    assert all("None" not in c and "nan" not in c and "inf" not in c for row in rows for c in row)
    assert benchmark_lines(summary)
    for _, series, _ in bench_panels(summary):
        assert all(math.isfinite(x) and x >= 1 for _, xs, _ in series for x in xs)


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bench") / "run"
    d.mkdir()
    return d


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(points=st.lists(POINT, min_size=1, max_size=4))
def test_plot_and_report_draw_what_is_in_range_and_never_crash(bench_dir, tmp_path_factory, points):
    d = tmp_path_factory.mktemp("p") / "run"
    shutil.copytree(bench_dir, d)
    write_summary(d, points, None)
    for verb in ("plot", "report"):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main([verb, str(d)])
        assert rc == 0 and "Traceback" not in err.getvalue(), (verb, err.getvalue())


@pytest.mark.parametrize("concurrency", [0, -4, 10 ** 400])
def test_a_concurrency_out_of_range_is_a_missing_point_not_a_log_scale_error(tmp_path, concurrency):
    write_summary(tmp_path, [{"concurrency": concurrency, "output_throughput": 5.0},
                             {"concurrency": 2, "output_throughput": 10 ** 400, "ttft_p50_ms": 3.0}], 2)
    summary = read_summary(tmp_path)
    assert summary is not None
    assert summary.points[0]["concurrency"] is None and summary.points[1]["output_throughput"] is None
    rows = charts.benchmark_rows(summary)
    assert rows[1][0] == "-" and rows[2][0] == "2" and rows[2][4] == "-"
    assert charts.benchmark_png(summary, "b") is not None


# ---- metric rows ------------------------------------------------------------------------------------
ORCH = ["reward_mean", "reward_std", "reward_min", "reward_max", "off_policy_lag", "tokens_per_s", "reload_s"]
TRAIN = ["loss", "kl", "kl_max", "kl_inference", "entropy", "clip_frac", "grad_norm", "tokens_per_s", "publish_s",
         "mfu", "cuda_mem_peak_gib", "cpu_rss_gib"]


def record(step: int, keys: list[str], draw) -> dict:
    rec = {k: draw(EXTREMES) for k in keys}
    rec["timing"] = {"generate_s": draw(EXTREMES), "step_s": draw(EXTREMES)}
    return {"step": step, **rec}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), steps=st.integers(1, 5))
def test_metric_rows_at_any_extreme_are_read_and_shown(tmp_path_factory, data, steps):
    d = tmp_path_factory.mktemp("m")
    (d / "job.sbatch").write_text("#!/bin/bash\n")
    paths = RunDir(d)
    paths.metrics("orchestrator").parent.mkdir(parents=True)
    for role, keys in (("orchestrator", ORCH), ("trainer", TRAIN)):
        lines = [json.dumps(record(s, keys, data.draw)) for s in range(steps)]
        paths.metrics(role).write_text("\n".join(lines) + "\n")
    rows = metrics.read_rows(paths.metrics("trainer"))
    for row in rows:  # every integer a float holds, or missing
        for v in [*row.values.values(), *row.values["timing"].values()]:
            assert not isinstance(v, int) or isinstance(v, bool) or abs(v) < 2 ** 1024
    last = metrics.last_row(paths.metrics("orchestrator"))
    assert last is not None
    line = training_line(OrchestratorRow.from_json(last.values, last.step),
                         TrainerRow.from_json(rows[-1].values, rows[-1].step))
    assert line and len(line) < 2000
    run = rd.read_run(paths)
    assert training_panels(run)  # the report's panels of the same rows
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["plot", str(d)])
    assert rc in (0, 2) and "Traceback" not in err.getvalue(), err.getvalue()
    if rc == 2:  # no finite reward at all: one line saying so
        assert "has no steps yet" in err.getvalue() and len(err.getvalue().splitlines()) == 1
