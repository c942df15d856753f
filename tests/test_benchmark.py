"""The [benchmark] table without a cluster: the schema's refusals, the component the planner adds
(its real command line in job.sbatch, expanded as its task would exec it), which components the
job waits for, and slurmrl.runtime.bench's results from fake per-point results (no vLLM here:
the real load generator runs in tests/test_restart_cluster.py, through a server's death)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from benchmark_plans import fake_result, inference, per_point, validate_err
from planner_jobs import RUN, B, P

from slurmrl import charts, cli
from slurmrl.app import job_outputs
from slurmrl.app.status_text import benchmark_lines
from slurmrl.contract.bench_summary import BenchSummary
from slurmrl.errors import UserError
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.bench import runner as bench

ROOT = Path(__file__).resolve().parent.parent
CHECK_ENDPOINT = bench.check_endpoint  # the real one (a fixture patches it for the runs below)
GRID = {"concurrencies": [1, 4], "input_lens": [32], "output_lens": [16], "num_prompts": 8, "timeout": 600}


# ---- the schema --------------------------------------------------------------------------------


@pytest.mark.parametrize("setting,field", [
    ("benchmark.concurrencies=[]", "benchmark.concurrencies"),
    ("benchmark.concurrencies=[0]", "benchmark.concurrencies.0"),
    ("benchmark.concurrencies=[1, 65537]", "benchmark.concurrencies.1"),
    ("benchmark.concurrencies=[2, 2]", "benchmark.concurrencies"),
    (f"benchmark.concurrencies={list(range(1, 66))}", "benchmark.concurrencies"),
    ("benchmark.input_lens=[]", "benchmark.input_lens"),
    ("benchmark.input_lens=[0]", "benchmark.input_lens.0"),
    ("benchmark.output_lens=[99999999999]", "benchmark.output_lens.0"),
    ("benchmark.num_prompts=0", "benchmark.num_prompts"),
    ("benchmark.num_prompts=1000001", "benchmark.num_prompts"),
    ("benchmark.request_rate=0", "benchmark.request_rate"),
    ("benchmark.request_rate=inf", "benchmark.request_rate"),
    ("benchmark.timeout=0", "benchmark.timeout"),
    ('benchmark.then="later"', "benchmark.then"),
    ('benchmark.extra_args=["--max-concurrency=3"]', "benchmark.extra_args"),
    ('benchmark.extra_args=["--base-url", "http://elsewhere"]', "benchmark.extra_args"),
    ("benchmark.unknown=1", "benchmark.unknown"),
])
def test_bad_benchmark_settings_are_one_line_naming_the_field(setting, field):
    assert validate_err(setting).startswith(f"slurmrl: error: {field}: ")


def test_absurd_grids_are_refused_before_any_work():
    err = validate_err(f"benchmark.concurrencies={list(range(1, 65))}", f"benchmark.input_lens={list(range(1, 6))}")
    assert "grid of 320 points; at most 256" in err and err.startswith("slurmrl: error: benchmark.concurrencies: ")
    err = validate_err(f"benchmark.concurrencies={list(range(1, 51))}", "benchmark.num_prompts=1000000")
    assert err.startswith("slurmrl: error: benchmark.num_prompts: ") and "50 points x 1000000" in err


@pytest.mark.parametrize("recipe", ["rl-debug", "sft-debug"])
def test_only_inference_jobs_benchmark(recipe):
    err = validate_err('benchmark.then="stop"', recipe=recipe)
    assert err.startswith("slurmrl: error: benchmark: is not used by kind")


def test_prompt_and_output_must_fit_the_context():
    err = validate_err("model.max_model_len=64", "benchmark.input_lens=[32, 60]", "benchmark.output_lens=[8]")
    assert err.startswith("slurmrl: error: benchmark.input_lens: ") and "68 tokens" in err


# ---- the plan and the script -------------------------------------------------------------------


def test_the_benchmark_runs_vllm_bench_serve_through_the_router_after_every_server():
    job = B(inference(GRID))
    p = job.plan
    c = p.component("benchmark")
    assert p.stages[-1].title == "benchmark" and p.stages[-1].components == ("benchmark",)
    assert (c.group, c.first_node, c.nodes, c.tasks_per_node, c.gpus_per_node, c.cpus_per_task) == (0, 0, 1, 1, 0, 2)
    assert "--gpus-per-node=0" in c.srun and "--kill-on-bad-exit=1" in c.srun  # a failing benchmark fails the job
    e = job.run("benchmark")
    assert e.supervisor == ["python3", "-m", "slurmrl.runtime.steps.supervise", "benchmark", "--ready", "started"]
    cmd = e.command
    sep = cmd.index("--")
    own, vllm_args = bench.parse(cmd[3:])
    assert cmd[:3] == ["python3", "-m", "slurmrl.runtime.bench"] and vllm_args == cmd[sep + 1:]
    assert own.out == f"{RUN}/benchmark" and own.then == "stop" and own.timeout == 600
    assert bench.grid(own.concurrencies, own.input_lens, own.output_lens) == [(1, 32, 16), (4, 32, 16)]
    router = job.urls["URLS_ROUTER"]
    assert router.startswith("http://g0n0:")
    assert bench.value_after(vllm_args, "--base-url") == router
    assert bench.value_after(vllm_args, "--dataset-name") == "random"
    assert bench.value_after(vllm_args, "--model") == "m" and bench.value_after(vllm_args, "--num-prompts") == "8"
    assert "--request-rate" not in vllm_args and "--disable-tqdm" in vllm_args
    assert "OPENAI_API_KEY" not in e.env  # the secret stays in its file; bench.py reads it
    # then = "stop": the job completes with the benchmark; the servers are no longer what it waits for
    assert [x.name for x in p.components if x.main] == ["benchmark"]
    assert job.script.rstrip().endswith("supervise benchmark")
    assert p.stop_order[0].components == ("benchmark",)


def test_then_serve_keeps_the_servers_main():
    job = B(inference({**GRID, "then": "serve", "request_rate": 2.5, "extra_args": ["--temperature", "0"]}))
    assert [x.name for x in job.plan.components if x.main] == ["inference"]
    assert job.script.rstrip().endswith("supervise inference")
    cmd = job.run("benchmark").command
    assert bench.value_after(cmd, "--then") == "serve"
    assert bench.value_after(cmd, "--request-rate") == "2.5"
    assert cmd[-2:] == ["--temperature", "0"]  # extra args last


def test_one_server_without_a_router_is_benchmarked_directly():
    job = B(inference(GRID, nodes=1))
    assert not any(c.name == "router" for c in job.plan.components)
    url = job.urls["URLS_INFERENCE"]
    assert bench.value_after(job.run("benchmark").command, "--base-url") == url


def test_a_dynamo_job_is_benchmarked_through_its_frontend():
    d = inference({**GRID, "then": "stop"}, nodes=1, backend="dynamo", auth="none", dynamo={"engine": "mocker"})
    job = B(d)
    assert bench.value_after(job.run("benchmark").command, "--base-url") == job.urls["URLS_FRONTEND"]
    assert [x.name for x in job.plan.components if x.main] == ["benchmark"]
    assert job.plan.component("benchmark").group == job.plan.component("frontend").group


def test_several_servers_without_a_router_are_refused():
    d = inference(GRID)
    d["inference"]["router"] = {"enabled": False}
    with pytest.raises(UserError, match="inference.router.enabled: .*2 servers without a router"):
        P(d)


def test_the_benchmark_takes_cpus_from_the_head_node_and_warns_about_a_short_grid():
    without, with_ = P(inference()), P(inference({**GRID, "num_prompts": 2}))
    assert with_.component("inference").cpus_per_task == without.component("inference").cpus_per_task - 2
    assert any("benchmark.num_prompts (2) is below the largest concurrency (4)" in w for w in with_.warnings)
    assert "benchmark" not in [c.name for c in without.components]


def test_a_preflight_probes_the_benchmark_too(tmp_path):
    from slurmrl.plan import plan
    from slurmrl.recipe.load import validate

    p = plan(validate(inference(GRID)), RUN, preflight=True)
    assert p.component("benchmark").task.command[-2:] == ("slurmrl.runtime.steps.probe", "benchmark")


# ---- slurmrl.runtime.bench ---------------------------------------------------------------------


def run_bench(tmp_path, runner, *extra: str, timeout: int = 60, concurrencies=("1", "4")) -> tuple[int, dict]:
    args, vllm_args = bench.parse([
        "--out", str(tmp_path / "benchmark"), "--concurrencies", *concurrencies, "--input-lens", "32", "64",
        "--output-lens", "16", "--timeout", str(timeout), *extra,
        "--", "--base-url", "http://front:1", "--served-model-name", "m", "--num-prompts", "8"])
    rc = bench.run(args, vllm_args, runner=runner)
    return rc, json.loads((tmp_path / "benchmark" / "summary.json").read_text())


@pytest.fixture(autouse=True)
def no_endpoint_check(monkeypatch):
    monkeypatch.setattr(bench, "check_endpoint", lambda *a, **k: None)
    monkeypatch.delenv("SLURMRL_RUN_DIR", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def test_the_summary_has_one_line_per_point_and_a_plot(tmp_path, capsys):
    stale = tmp_path / "benchmark" / "c9-in9-out9.json"
    stale.parent.mkdir()
    stale.write_text("{}")  # an earlier attempt's
    runner = per_point(fake_result)
    rc, s = run_bench(tmp_path, runner)
    assert rc == 0 and s["status"] == "done" and s["error"] is None and s["finished"] >= s["started"]
    assert runner.calls == [(1, 32, 16), (4, 32, 16), (1, 64, 16), (4, 64, 16)]
    assert (s["target"], s["model"], s["num_prompts"], s["planned_points"]) == ("http://front:1", "m", 8, 4)
    p = s["points"][1]
    assert (p["concurrency"], p["input_len"], p["output_len"], p["completed"], p["failed"]) == (4, 32, 16, 8, 0)
    assert p["output_throughput"] == 96.0 and p["request_throughput"] == 6.0 and p["total_token_throughput"] == 288.0
    assert (p["ttft_p50_ms"], p["ttft_p99_ms"], p["tpot_p50_ms"], p["itl_p99_ms"], p["e2el_p50_ms"]) == (
        40.0, 80.0, 1.0, 3.0, 30.0)
    files = sorted(f.name for f in (tmp_path / "benchmark").iterdir())
    assert files == ["benchmark.png", "c1-in32-out16.json", "c1-in64-out16.json", "c4-in32-out16.json",
                     "c4-in64-out16.json", "summary.json"]
    point = json.loads((tmp_path / "benchmark" / "c4-in32-out16.json").read_text())
    assert point["output_throughput"] == 96.0 and "generated_texts" not in point and "ttfts" not in point
    out = capsys.readouterr().out
    assert "best 96.0 output tok/s at concurrency 4 (in 32, out 16)" in out
    assert job_outputs.read_benchmark(tmp_path) == BenchSummary.from_json(s, "s")
    assert BenchSummary.from_json(s, "s").to_json() == s and s["mode"] == "grid"
    rows = charts.benchmark_rows(BenchSummary.from_json(s, "s"))
    assert rows[0][:4] == ["conc", "in", "out", "req/s"] and rows[2][:6] == ["4", "32", "16", "6.00", "96.0", "288.0"]


def test_a_point_where_every_request_fails_stops_the_benchmark(tmp_path, capsys):
    runner = per_point(lambda c, i, o: fake_result(c, i, o, failed=8, error="HTTP 401 Unauthorized"))
    rc, s = run_bench(tmp_path, runner)
    assert rc == 1 and len(runner.calls) == 1 and s["status"] == "failed"
    assert s["error"] == "at point 1/4 (concurrency 1, in 32, out 16): all 8 requests failed: HTTP 401 Unauthorized"
    assert "failed: at point 1/4" in capsys.readouterr().out


def test_some_failed_requests_run_the_grid_and_fail_at_the_end(tmp_path):
    runner = per_point(lambda c, i, o: fake_result(c, i, o, failed=2 if c == 4 else 0, error="timeout"))
    rc, s = run_bench(tmp_path, runner)
    assert rc == 1 and len(runner.calls) == 4 and len(s["points"]) == 4
    assert s["error"] == "in 2 of 4 point(s): 4 request(s) failed (first: timeout)"


def test_a_vllm_error_is_named_with_its_point(tmp_path):
    def runner(argv):
        raise ValueError("Invalid header format")

    rc, s = run_bench(tmp_path, runner)
    assert rc == 1 and s["points"] == []
    assert s["error"] == "at point 1/4 (concurrency 1, in 32, out 16): ValueError: Invalid header format"


def test_the_timeout_fails_the_benchmark_at_the_point_it_was_running(tmp_path):
    def runner(argv):
        if bench.value_after(argv, "--input-len") == "64":
            time.sleep(30)
        return per_point(fake_result)(argv)

    start = time.monotonic()
    rc, s = run_bench(tmp_path, runner, timeout=2, concurrencies=("1",))
    assert rc == 1 and time.monotonic() - start < 10
    assert s["error"] == "benchmark.timeout (2 s) ran out at point 2/2 (concurrency 1, in 64, out 16)"
    assert len(s["points"]) == 1 and s["status"] == "failed"


def test_the_secret_goes_to_vllm_as_its_api_key_and_the_endpoint_is_checked(tmp_path, monkeypatch):
    secret_file = tmp_path / "secret"
    secret_file.write_text("s3cret\n")
    monkeypatch.setenv("SLURMRL_SECRET_FILE", str(secret_file))
    seen = []
    monkeypatch.setattr(bench, "check_endpoint", lambda base, model, headers: seen.append((base, model, headers)))
    keys = []
    rc, _ = run_bench(tmp_path, per_point(lambda c, i, o: keys.append(os.environ.get("OPENAI_API_KEY"))
                                          or fake_result(c, i, o)))
    assert rc == 0 and set(keys) == {"s3cret"}
    assert seen == [("http://front:1", "m", {"Authorization": "Bearer s3cret"})]


class Front(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        if self.headers.get("Authorization") != "Bearer good":
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps({"data": [{"id": "m"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_check_endpoint_names_a_refused_secret_and_a_wrong_model():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Front)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}"
    real = CHECK_ENDPOINT
    try:
        real(base, "m", {"Authorization": "Bearer good"})
        with pytest.raises(bench.Failed, match="HTTP 401: the endpoint refused the job secret"):
            real(base, "m", {"Authorization": "Bearer bad"})
        with pytest.raises(bench.Failed, match=r"serves \['m'\], not 'other'"):
            real(base, "other", {"Authorization": "Bearer good"})
        with pytest.raises(bench.Failed, match="GET http://127.0.0.1:1/v1/models"):
            real("http://127.0.0.1:1", "m", {}, wait_s=0)
    finally:
        srv.shutdown()


def test_then_serve_waits_after_its_results_until_the_job_stops_it(tmp_path):
    driver = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent / 'support')!r})
from benchmark_plans import fake_result, per_point
from slurmrl.runtime.bench import runner as bench
bench.check_endpoint = lambda *a, **k: None
bench.vllm_runner = lambda: per_point(fake_result)
sys.exit(bench.main(["--out", {str(tmp_path / "benchmark")!r}, "--concurrencies", "1", "--input-lens", "8",
                     "--output-lens", "4", "--then", "serve", "--", "--base-url", "http://front:1"]))
"""
    p = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={k: v for k, v in os.environ.items() if k != "SLURMRL_RUN_DIR"})
    try:
        lines = []
        for line in p.stdout:
            lines.append(line)
            if "keep serving" in line:
                break
        assert json.loads((tmp_path / "benchmark" / "summary.json").read_text())["status"] == "done", lines
        time.sleep(0.5)
        assert p.poll() is None  # still there: the job goes on serving
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()


# ---- status and plot ---------------------------------------------------------------------------


def test_status_and_plot_show_the_results(tmp_path, capsys):
    rc, s = run_bench(tmp_path, per_point(fake_result))
    capsys.readouterr()
    lines = benchmark_lines(job_outputs.read_benchmark(tmp_path))
    text = "\n".join(lines)
    assert "benchmark: done, 4/4 point(s) against http://front:1" in text
    assert "TTFT p50/p99" in text and "40.0/80.0" in text
    assert benchmark_lines(None) == []
    s["status"], s["error"] = "failed", "at point 3/4 (concurrency 1, in 64, out 16): ValueError: x"
    assert "    error: at point 3/4" in "\n".join(benchmark_lines(BenchSummary.from_json(s, "s")))
    (tmp_path / "benchmark" / "benchmark.png").unlink()
    assert cli.main(["plot", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "out tok/s" in out and (tmp_path / "benchmark" / "benchmark.png").stat().st_size > 0
    assert RunDir(tmp_path).benchmark_plot() == tmp_path / "benchmark" / "benchmark.png"


def test_nothing_on_the_login_node_imports_vllm():
    """plan, render, submit, status and plot stay light; bench imports vLLM only when it runs a point."""
    code = ("import sys, slurmrl.cli, slurmrl.plan, slurmrl.render, slurmrl.app.build, slurmrl.app.submit, "
            "slurmrl.app.status, slurmrl.app.plot, slurmrl.runtime.bench.runner; print(sorted(m for m in sys.modules if m.split('.')[0] == 'vllm'))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    code = "import sys, slurmrl.runtime.bench.runner; print(sorted(m for m in sys.modules if m.startswith(('pydantic', 'slurmrl.plan'))))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_the_timeout_warns_against_the_time_limit_only_when_the_user_set_it():
    """The default benchmark.timeout (3600 s) is only a cap: against a 30 min slurm.time (the example
    recipe's) nothing to warn about; a timeout the user set past the time limit: the warning."""
    def warned(d: dict) -> bool:
        return any("benchmark.timeout" in w for w in P(d).warnings)

    short = inference({k: v for k, v in GRID.items() if k != "timeout"})
    short["slurm"]["time"] = "00:30:00"
    assert not warned(short)
    del short["slurm"]["time"]
    assert not warned(short)
    assert warned({**short, "benchmark": {**short["benchmark"], "timeout": 7200}})
    assert not warned({**short, "benchmark": {**short["benchmark"], "timeout": 600}})
