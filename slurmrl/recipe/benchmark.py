"""[benchmark]: a load test of the job's own endpoint."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from slurmrl.errors import UserError
from slurmrl.recipe.fields import FAIL_ON_HELP, FailOn
from slurmrl.settings.limits import MAX_TOKENS
from slurmrl.settings.section import PathText, Section

# vllm bench serve flags the [benchmark] table sets itself: per grid point, or where results go
BENCH_MANAGED_FLAGS = (
    "--base-url", "--host", "--port", "--max-concurrency", "--num-prompts", "--input-len", "--output-len",
    "--random-input-len", "--random-output-len", "--request-rate", "--save-result", "--append-result",
    "--save-detailed", "--result-dir", "--result-filename", "--dataset-name", "--dataset-path", "--goodput",
    "--self-timed", "--no-self-timed", "--timed-trace-chunk-hash-size", "--timed-trace-sec-multiplier",
)
# aiperf profile flags a multi-turn replay sets itself (benchmark.trace_format = "multi_turn")
AIPERF_MANAGED_FLAGS = (
    "--url", "-u", "--model", "--model-names", "-m", "--tokenizer", "--endpoint-type", "--streaming",
    "--input-file", "--custom-dataset-type", "--goodput", "--concurrency", "--conversation-num",
    "--num-conversations", "--num-sessions", "--request-count", "--request-rate", "--output-artifact-dir",
    "--artifact-dir", "--profile-export-prefix", "--profile-export-file", "--ui-type", "--ui", "--api-key",
    "--use-server-token-count", "--workers-max", "--max-workers", "--config", "-f", "--fixed-schedule",
)
MAX_BENCH_POINTS = 256  # grid points (concurrencies x input_lens x output_lens)
MAX_BENCH_REQUESTS = 10**7  # requests over the whole grid
# what a trace replay takes from the trace itself: set with benchmark.trace, they would do nothing
TRACE_DECIDES = {"input_lens": "each request's lengths", "output_lens": "each request's lengths",
                 "request_rate": "when each request is sent"}
TRACE_ONLY = ("trace_format", "trace_speedup")
# what a multi-turn replay (aiperf) cannot do: one line each
MULTI_TURN_REFUSES = {
    "trace_speedup": "aiperf's multi_turn replay sends each turn after its recorded delay and has no speed-up; "
                     "scale the delays in the trace",
    "num_prompts": "a multi-turn replay sends every session of the trace; cut the trace file instead",
}
GRID_CONCURRENCIES = (1, 8, 32)  # the grid's points where benchmark.concurrencies is not set
GRID_REQUESTS = 200  # the grid's requests per point where benchmark.num_prompts is not set


class Benchmark(Section):
    """A load test of the job's own endpoint once every server is ready: vLLM's load generator
    (`vllm bench serve`), either random prompts over a grid of concurrency x input length x output length,
    or the replay of a request trace (`trace`) at the trace's own times; or aiperf replaying multi-turn
    sessions (`trace_format = "multi_turn"`); goodput under latency targets (`goodput_ttft_ms`,
    `goodput_tpot_ms`, `goodput_e2el_ms`) in each."""

    concurrencies: list[Annotated[int, Field(ge=1, le=65536)]] | None = Field(
        None, min_length=1, max_length=64,
        description="Requests in flight at once (`--max-concurrency`), one point each (1-64 values, each "
        "1-65536); default: [1, 8, 32] for the grid, one point without a cap for a `trace` replay.",
    )
    input_lens: list[Annotated[int, Field(ge=1, le=MAX_TOKENS)]] = Field(
        default_factory=lambda: [512], min_length=1, max_length=64,
        description=f"Prompt lengths in tokens, random prompts (1-64 values, each 1-{MAX_TOKENS}).",
    )
    output_lens: list[Annotated[int, Field(ge=1, le=MAX_TOKENS)]] = Field(
        default_factory=lambda: [128], min_length=1, max_length=64,
        description=f"Tokens generated per request, end of sequence ignored (1-64 values, each 1-{MAX_TOKENS}).",
    )
    num_prompts: int | None = Field(
        None, ge=1, le=1_000_000,
        description="Requests per point (1-1000000); default: 200 for the grid, every request of the trace for "
        "a `trace` replay (set: its first this many).",
    )
    request_rate: float | None = Field(
        None, gt=0, le=1_000_000,
        description="Requests per second each point sends (Poisson arrivals); default: all at once, held to "
        "the point's concurrency (above 0, at most 1000000).",
    )
    trace: PathText | None = Field(
        None,
        description="Replay this request trace instead of the random grid: an absolute path to a JSONL file, one "
        "request a line, read on the benchmark's node (a shared filesystem). Each request is sent at its "
        "`timestamp` with `input_length` prompt tokens made from its `hash_ids` (requests that share a hash id "
        "share that block of prompt, so prefix caching sees the trace's reuse) and `output_length` tokens out: "
        "vLLM's `timed_trace` dataset. One point per value of `concurrencies` where set (at most that many "
        "requests in flight), else one point with no cap.",
    )
    trace_format: Literal["mooncake", "multi_turn"] = Field(
        "mooncake",
        description="`trace`'s format: `mooncake` (Mooncake's published traces, e.g. the conversation trace: "
        "timestamps in milliseconds, 512 prompt tokens per hash id; vLLM's load generator), or `multi_turn` "
        "(aiperf's multi-turn sessions, one a line: `{\"session_id\": ..., \"turns\": [{\"text\": ..., "
        "\"delay\": MS, \"output_length\": N}, ...]}`: each turn is sent with the conversation so far, "
        "the answers included, `delay` ms after the previous answer arrived; sessions run concurrently, at "
        "most `concurrencies` at once, else all; run by `aiperf profile` from `aiperf_python`).",
    )
    aiperf_python: PathText | None = Field(
        None,
        description="`trace_format = \"multi_turn\"`: the absolute path of the Python of aiperf's own venv "
        "on the benchmark's node (scripts/install.sh makes `.venv-aiperf`: aiperf's pins conflict with vLLM's).",
    )
    trace_speedup: float = Field(
        1.0, gt=0, le=10_000,
        description="`trace`: replay this many times faster than recorded (2: a 60-minute trace in 30; above 0, "
        "at most 10000).",
    )
    goodput_ttft_ms: float | None = Field(
        None, gt=0, le=86_400_000,
        description="Goodput target: a request is good only if its first token came within this many ms "
        "(srt-slurm's default target: 2000); with any goodput target the summary has good requests/s (above 0, at "
        "most 86400000).",
    )
    goodput_tpot_ms: float | None = Field(
        None, gt=0, le=86_400_000,
        description="Goodput target: ... and its mean time between output tokens after the first (TPOT, the "
        "request's mean inter-token latency) within this many ms (srt-slurm's default: 25; above 0, at most 86400000).",
    )
    goodput_e2el_ms: float | None = Field(
        None, gt=0, le=86_400_000,
        description="Goodput target: ... and the whole request within this many ms (above 0, at most 86400000).",
    )
    then: Literal["stop", "serve"] = Field(
        "stop",
        description="After the benchmark: `stop` ends the job (it completes when the benchmark succeeds); "
        "`serve` keeps the servers serving until the job is cancelled or runs out of time.",
    )
    timeout: int = Field(
        3600, ge=1, le=7 * 86400,
        description="Seconds the whole grid may take; past it the benchmark fails the job (1-604800, 7 days).",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="Extra `vllm bench serve` arguments for every point, e.g. `--temperature 0` or "
        "`--num-warmups 4`; the flags the grid sets itself are refused.",
    )
    fail_on: FailOn = Field(default_factory=list, description=FAIL_ON_HELP.format(what="the benchmark"))

    @property
    def multi_turn(self) -> bool:
        """A multi-turn session replay (aiperf), not vLLM's load generator."""
        return self.trace is not None and self.trace_format == "multi_turn"

    @model_validator(mode="after")
    def _extra(self) -> Benchmark:
        managed, tool = (AIPERF_MANAGED_FLAGS, "aiperf profile") if self.multi_turn else (
            BENCH_MANAGED_FLAGS, "vllm bench serve")
        for a in self.extra_args:
            flag = a.split("=", 1)[0]
            if flag in managed:
                raise UserError("benchmark.extra_args", f"{flag} is set by the benchmark itself (grid point, "
                                f"target or results folder); extra_args are {tool}'s here")
        return self

    @model_validator(mode="after")
    def _trace(self) -> Benchmark:
        """Knobs a trace replay takes from the trace refused with one (and trace-only knobs without one)."""
        if self.trace is None:
            for name in (*TRACE_ONLY, "aiperf_python"):
                if name in self.model_fields_set:
                    raise UserError(f"benchmark.{name}", "only a trace replay reads it; set benchmark.trace too")
            return self
        for name, what in TRACE_DECIDES.items():
            if name in self.model_fields_set:
                raise UserError(f"benchmark.{name}", f"a trace replay takes {what} from benchmark.trace; remove it")
        if not self.trace.startswith("/"):
            raise UserError("benchmark.trace", f"{self.trace!r} is not an absolute path (the benchmark reads it on "
                            "its node, from another directory)")
        return self._aiperf()

    def _aiperf(self) -> Benchmark:
        """A multi-turn replay needs aiperf's Python and refuses what aiperf cannot do; nothing else reads it."""
        if not self.multi_turn:
            if self.aiperf_python is not None:
                raise UserError("benchmark.aiperf_python", "only a multi-turn replay (trace_format = "
                                "\"multi_turn\") runs aiperf; remove it")
            return self
        for name, why in MULTI_TURN_REFUSES.items():
            if name in self.model_fields_set:
                raise UserError(f"benchmark.{name}", why)
        if self.aiperf_python is None or not self.aiperf_python.startswith("/"):
            raise UserError("benchmark.aiperf_python", "a multi-turn replay runs aiperf: set the absolute path of "
                            "its venv's Python (.venv-aiperf/bin/python, made by scripts/install.sh)")
        return self

    def goodput(self) -> list[str]:
        """vllm bench serve's ``--goodput`` values (``ttft:2000`` ...): the targets set, none without."""
        targets = (("ttft", self.goodput_ttft_ms), ("tpot", self.goodput_tpot_ms), ("e2el", self.goodput_e2el_ms))
        return [f"{name}:{ms:g}" for name, ms in targets if ms is not None]

    def caps(self) -> list[int] | None:
        """Each point's concurrency cap: the recipe's, else [1, 8, 32] for the grid and none for a trace."""
        if self.concurrencies is not None:
            return list(self.concurrencies)
        return None if self.trace is not None else list(GRID_CONCURRENCIES)

    def requests(self) -> int | None:
        """Requests per point: the recipe's, else 200 for the grid and the whole trace (None) for a trace."""
        if self.num_prompts is not None:
            return self.num_prompts
        return None if self.trace is not None else GRID_REQUESTS

    @model_validator(mode="after")
    def _grid(self) -> Benchmark:
        for name in ("concurrencies", "input_lens", "output_lens"):
            values = getattr(self, name) or []
            if len(set(values)) != len(values):
                raise UserError(f"benchmark.{name}", f"{values} lists a value twice")
        if self.trace is not None:
            return self
        caps, requests = self.caps() or [], self.requests() or 0
        points = len(caps) * len(self.input_lens) * len(self.output_lens)
        if points > MAX_BENCH_POINTS:
            raise UserError("benchmark.concurrencies", f"a grid of {points} points; at most {MAX_BENCH_POINTS}")
        if points * requests > MAX_BENCH_REQUESTS:
            raise UserError("benchmark.num_prompts", f"{points} points x {requests} requests is more than "
                            f"{MAX_BENCH_REQUESTS} requests")
        return self

    def points(self) -> list[tuple[int, int, int]]:
        """(concurrency, input length, output length) of every grid point, in run order."""
        return [(c, i, o) for i in self.input_lens for o in self.output_lens for c in self.caps() or []]
