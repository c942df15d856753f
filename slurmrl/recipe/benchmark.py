"""[benchmark]: a load test of the job's own endpoint."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from slurmrl.errors import UserError
from slurmrl.recipe.fields import FAIL_ON_HELP, FailOn
from slurmrl.settings.limits import MAX_TOKENS
from slurmrl.settings.section import Section

# vllm bench serve flags the [benchmark] table sets itself: per grid point, or where results go
BENCH_MANAGED_FLAGS = (
    "--base-url", "--host", "--port", "--max-concurrency", "--num-prompts", "--input-len", "--output-len",
    "--random-input-len", "--random-output-len", "--request-rate", "--save-result", "--append-result",
    "--save-detailed", "--result-dir", "--result-filename",
)
MAX_BENCH_POINTS = 256  # grid points (concurrencies x input_lens x output_lens)
MAX_BENCH_REQUESTS = 10**7  # requests over the whole grid


class Benchmark(Section):
    """A load test of the job's own endpoint once every server is ready: vLLM's load generator
    (`vllm bench serve`, random prompts) over a grid of concurrency x input length x output length."""

    concurrencies: list[Annotated[int, Field(ge=1, le=65536)]] = Field(
        default_factory=lambda: [1, 8, 32], min_length=1, max_length=64,
        description="Requests in flight at once (`--max-concurrency`), one grid point each (1-64 values, "
        "each 1-65536).",
    )
    input_lens: list[Annotated[int, Field(ge=1, le=MAX_TOKENS)]] = Field(
        default_factory=lambda: [512], min_length=1, max_length=64,
        description=f"Prompt lengths in tokens, random prompts (1-64 values, each 1-{MAX_TOKENS}).",
    )
    output_lens: list[Annotated[int, Field(ge=1, le=MAX_TOKENS)]] = Field(
        default_factory=lambda: [128], min_length=1, max_length=64,
        description=f"Tokens generated per request, end of sequence ignored (1-64 values, each 1-{MAX_TOKENS}).",
    )
    num_prompts: int = Field(200, ge=1, le=1_000_000, description="Requests per grid point (1-1000000).")
    request_rate: float | None = Field(
        None, gt=0, le=1_000_000,
        description="Requests per second each point sends (Poisson arrivals); default: all at once, held to "
        "the point's concurrency (above 0, at most 1000000).",
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

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for a in v:
            flag = a.split("=", 1)[0]
            if flag in BENCH_MANAGED_FLAGS:
                raise ValueError(f"{flag} is set by the benchmark itself (grid point, target or results folder)")
        return v

    @model_validator(mode="after")
    def _grid(self) -> Benchmark:
        points = len(self.concurrencies) * len(self.input_lens) * len(self.output_lens)
        if points > MAX_BENCH_POINTS:
            raise UserError("benchmark.concurrencies", f"a grid of {points} points; at most {MAX_BENCH_POINTS}")
        if points * self.num_prompts > MAX_BENCH_REQUESTS:
            raise UserError("benchmark.num_prompts", f"{points} points x {self.num_prompts} requests is more than "
                            f"{MAX_BENCH_REQUESTS} requests")
        for name in ("concurrencies", "input_lens", "output_lens"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise UserError(f"benchmark.{name}", f"{values} lists a value twice")
        return self

    def points(self) -> list[tuple[int, int, int]]:
        """(concurrency, input length, output length) of every grid point, in run order."""
        return [(c, i, o) for i in self.input_lens for o in self.output_lens for c in self.concurrencies]
