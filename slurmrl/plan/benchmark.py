"""The benchmark: vLLM's load generator (``vllm bench serve``) against the job's own endpoint
(vllm-router, Dynamo's frontend, or the one server), once it is ready, over the recipe's grid of
concurrency x input length x output length. CPU only, on the node of that endpoint (the head
node of the first inference group). ``slurmrl.runtime.bench`` runs one ``vllm bench serve`` per grid point and writes the
results under RUN_DIR/benchmark/ (``slurmrl.rundir.paths``). A multi-turn session replay
(``trace_format = "multi_turn"``) runs ``aiperf profile`` from aiperf's own venv instead, through the
same runner and into the same summary.

With ``then = "stop"`` the benchmark is the job's one main component: the job completes when it
exits 0 and then stops the servers. With ``then = "serve"`` the servers stay the main components
and the benchmark, its results written, waits for the job to end. A benchmark that fails fails
the job either way (``--kill-on-bad-exit=1``; the script's FAILED file names it).
"""

from __future__ import annotations

from slurmrl.contract.programs import BenchArgs
from slurmrl.errors import UserError
from slurmrl.plan.context import Context
from slurmrl.plan.model import Arg, Health, Instance, Sh
from slurmrl.plan.spec import Spec, Supervisor
from slurmrl.recipe.benchmark import Benchmark
from slurmrl.recipe.slurm_values import time_seconds
from slurmrl.recipe.user_set import user_set
from slurmrl.rundir.paths import RunDir

BENCH_CPUS = 2  # the asyncio client and the tokenizer that makes the random prompts
STAGE = 5
# vllm bench serve reports mean, median and p99 of these (the summary takes median as p50)
PERCENTILE_METRICS = "ttft,tpot,itl,e2el"
# benchmark.trace_format -> (prompt tokens per hash id, seconds per timestamp unit)
TRACE_FORMATS = {"mooncake": (512, 0.001)}
# benchmark.goodput_* -> aiperf's goodput metric tags (aiperf's inter_token_latency is vLLM's TPOT: a
# request's mean time between output tokens after the first)
AIPERF_GOODPUT = {"ttft": "time_to_first_token", "tpot": "inter_token_latency", "e2el": "request_latency"}
FRONTS = ("router", "frontend")  # what clients talk to when the job has one: vllm-router, Dynamo's frontend


def _health(c: Spec) -> Health:
    assert c.health is not None, "the router, the frontend and every inference server have a readiness check"
    return c.health


def endpoint(ctx: Context) -> tuple[Spec, Sh]:
    """(the component the load goes to, its URL as the batch shell exports it once it is ready):
    the router's or frontend's, else the one vLLM server's."""
    front = next((c for c in ctx.specs if c.name in FRONTS), None)
    if front is not None:
        return front, Sh(sh=f"${{{_health(front).urls_var}}}")
    servers = [c for c in ctx.specs if c.role == "inference"]
    serving = [i for c in servers for i in c.instances
               if "http" in i.ports and not (_health(c).first_node_only and i.node)]
    if len(serving) != 1:
        raise UserError(
            "inference.router.enabled",
            f"the benchmark needs one address to load, and the job has {len(serving)} servers without a router; "
            "enable the router",
        )
    return servers[0], Sh(sh=f"${{{_health(servers[0]).urls_var}}}")


def dataset_args(bench: Benchmark) -> list[Arg]:
    """vllm bench serve's dataset: random prompts for the grid; for a trace, vLLM's ``timed_trace``
    replay with the format's prompt block size and its timestamps scaled to seconds and the speed-up."""
    if bench.trace is None:
        return ["--dataset-name", "random"]
    block, to_seconds = TRACE_FORMATS[bench.trace_format]
    return ["--dataset-name", BenchArgs.TRACE, "--dataset-path", bench.trace,
            "--timed-trace-chunk-hash-size", str(block),
            "--timed-trace-sec-multiplier", f"{to_seconds / bench.trace_speedup:g}"]


def aiperf_args(ctx: Context, bench: Benchmark, url: Sh) -> list[Arg]:
    """``aiperf profile``'s arguments for a multi-turn replay: the chat endpoint, streamed (TTFT and the
    time between tokens), the trace as aiperf's ``multi_turn`` dataset, token counts as the server reports
    them, goodput under the targets; the runner adds each point's concurrency and results folder."""
    assert bench.trace is not None
    argv: list[Arg] = [
        "--url", url, "--model", ctx.r.model.served_model_name,
        "--tokenizer", ctx.model_path(),  # aiperf counts tokens with it: the node-local copy with model.stage
        "--endpoint-type", "chat", "--streaming",
        "--input-file", bench.trace, "--custom-dataset-type", "multi_turn",
        "--use-server-token-count", "--workers-max", str(BENCH_CPUS),
    ]
    if ctx.r.model.trust_remote_code:
        argv.append("--tokenizer-trust-remote-code")
    if bench.goodput():
        argv += ["--goodput", " ".join(f"{AIPERF_GOODPUT[t.split(':')[0]]}:{t.split(':')[1]}" for t in bench.goodput())]
    return [*argv, *bench.extra_args]


def vllm_args(ctx: Context, bench: Benchmark, url: Sh) -> list[Arg]:
    """``vllm bench serve``'s arguments for the grid or a single-turn trace (the runner adds each point's)."""
    requests = bench.requests()
    argv: list[Arg] = [
        "--base-url", url,
        *dataset_args(bench),
        "--model", ctx.model_path(),  # the tokenizer: the node-local copy with model.stage
        "--served-model-name", ctx.r.model.served_model_name,
    ]
    if requests is not None:  # a trace replay without it: the runner counts the trace's requests
        argv += ["--num-prompts", str(requests)]
    if bench.goodput():
        argv += ["--goodput", *bench.goodput()]
    if bench.request_rate is not None:
        argv += ["--request-rate", f"{bench.request_rate:g}"]
    if ctx.r.model.trust_remote_code:
        argv.append("--trust-remote-code")
    argv += ["--percentile-metrics", PERCENTILE_METRICS, "--disable-tqdm", *bench.extra_args]
    return argv


def points(bench: Benchmark) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None, tuple[int, ...] | None]:
    """The runner's points (concurrencies, input lengths, output lengths): the grid's three axes, or a
    trace's concurrency caps alone (none: one point without a cap)."""
    caps = bench.caps()
    if bench.trace is not None:
        return (tuple(caps) if caps else None), None, None
    return tuple(caps or ()), tuple(bench.input_lens), tuple(bench.output_lens)


def benchmark(ctx: Context) -> None:
    r, bench = ctx.r, ctx.r.benchmark
    if bench is None:
        return
    front, url = endpoint(ctx)
    head = ctx.groups[front.group]
    ctx.reserve(head, 0, BENCH_CPUS, "the benchmark")
    caps, requests = bench.caps(), bench.requests()
    if caps and requests is not None and requests < max(caps):
        ctx.warnings.append(
            f"benchmark.num_prompts ({requests}) is below the largest concurrency "
            f"({max(caps)}): that point never has that many requests in flight"
        )
    limit = time_seconds(r.slurm.time)  # None: no time limit
    # the default timeout (3600 s) is only a cap: the time limit ends a longer benchmark anyway
    if limit is not None and bench.timeout > limit and user_set(bench, "timeout"):
        ctx.warnings.append(f"benchmark.timeout ({bench.timeout} s) is longer than slurm.time ({r.slurm.time})")
    # then = "stop": the job completes with the benchmark, not with the servers (ctx.serving_is_main)
    if bench.multi_turn:
        assert bench.aiperf_python is not None  # the recipe refuses a multi-turn replay without it
        program = BenchArgs[Arg](Sh(sh="${RUN_DIR}/" + RunDir.BENCHMARK), *points(bench), bench.timeout, bench.then,
                                 tuple(aiperf_args(ctx, bench, url)), bench.aiperf_python)
    else:
        program = BenchArgs[Arg](Sh(sh="${RUN_DIR}/" + RunDir.BENCHMARK), *points(bench), bench.timeout, bench.then,
                                 tuple(vllm_args(ctx, bench, url)))
    command = [*ctx.py, "-m", BenchArgs.MODULE, *program.to_argv()]
    ctx.add(Spec(
        name="benchmark", role="benchmark", group=head.index, first_node=0, nodes=1, tasks_per_node=1,
        cpus_per_task=BENCH_CPUS, gpus_per_node=0, stage=STAGE, main=bench.then == "stop", health=None,
        instances=(Instance(rank=0, node=0, local=0, gpus=(), ports={}),),
        reads_model=True,
        task=ctx.task(Supervisor("benchmark", ready="started", fail_on=tuple(bench.fail_on)), command=tuple(command)),
    ))
