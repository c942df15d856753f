"""What a job writes into its run dir, read back for `status`, `plot` and a sweep's report: metrics rows
(metrics/*.jsonl), the benchmark's summary, an attempt's FAILED reason, each through the run-dir layer's
typed reader (slurmrl.rundir): a file that cannot be read is one line naming it, never a traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from slurmrl.contract.bench_summary import BenchSummary
from slurmrl.contract.metrics import OrchestratorRow, TrainerRow, finite, number
from slurmrl.errors import UserError
from slurmrl.rundir import benchmark, evals, metrics
from slurmrl.rundir.notes import read_note
from slurmrl.rundir.paths import RunDir

T = TypeVar("T")
Reader = Callable[[dict, int], T]  # a typed row's from_json (slurmrl.contract.metrics)


def typed(read: Reader[T], record: dict | None) -> T | None:
    """A record as written (status's report carries them so) as its typed row; None without one or its step."""
    step = record.get("step") if record else None
    if record is None or isinstance(step, bool) or not isinstance(step, int):
        return None
    return read(record, step)


def read_typed(read: Reader[T], path: Path) -> dict[int, T]:
    """Step -> the typed last record of that step in a metrics JSONL file (a requeued step overwrites)."""
    return {step: read(row.values, step) for step, row in metrics.by_step(path).items()}


def latest_metrics(run_dir: Path) -> dict | None:
    """The newest step of the run: {"step", "reward"} (RL: the orchestrator's) or {"step", "loss"} (the trainer's)."""
    paths = RunDir(run_dir)
    for row in reversed(metrics.read_rows(paths.metrics("orchestrator"))):
        if (reward := number(OrchestratorRow.from_json(row.values, row.step).reward_mean)) is not None:
            return {"step": row.step, "reward": reward}
    for row in reversed(metrics.read_rows(paths.metrics("trainer"))):
        if (loss := number(TrainerRow.from_json(row.values, row.step).loss)) is not None:
            return {"step": row.step, "loss": loss}
    return None


def read_rewards(run_dir: Path) -> list[tuple[int, float]]:
    """(step, mean reward) per step with a finite reward (a requeued step's later record wins)."""
    path = RunDir(run_dir).metrics("orchestrator")
    if not path.exists():
        raise UserError(str(run_dir), "has no metrics/orchestrator.jsonl (nor benchmark/summary.json) yet: is it "
                                      "an RL run, or a run with a [benchmark], that has started?")
    points = {step: finite(row.reward_mean) for step, row in read_typed(OrchestratorRow.from_json, path).items()}
    return sorted((step, reward) for step, reward in points.items() if reward is not None)


def last_record(path: Path) -> dict | None:
    """The newest record of a metrics file, reading only its end."""
    row = metrics.last_row(path)
    return row.to_json() if row else None


def read_evaluations(run_dir: Path) -> list[evals.Evaluation]:
    """Every evaluation of an [eval] run (metrics/eval.jsonl), by step; [] without one."""
    return evals.read_evals(RunDir(run_dir).eval_metrics)


def read_benchmark(run_dir: Path) -> BenchSummary | None:
    """RUN_DIR/benchmark/summary.json, typed (checked by slurmrl.rundir.benchmark), or None when there is none."""
    return benchmark.read_summary(run_dir)


def failed_reason(run_dir: Path, attempt: int) -> str | None:
    text = read_note(RunDir(run_dir).failed_file(attempt))
    return None if text is None else text or "(no reason given)"
