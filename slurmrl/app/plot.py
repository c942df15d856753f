"""`slurmrl plot RUN_DIR`: the reward curve of an RL run, in the terminal and as RUN_DIR/reward.png
(with a second panel of the trainer's KL, clip fraction and entropy per step); for a run with a
[benchmark], its results as a table and RUN_DIR/benchmark/benchmark.png. Also the latest training
row `slurmrl status` shows."""

from __future__ import annotations

import math
from pathlib import Path

from slurmrl.app import sweep_report
from slurmrl.app.job_outputs import last_record, read_benchmark, read_evaluations, read_rewards, read_typed, typed
from slurmrl.app.sweep_dir import is_sweep_dir
from slurmrl.charts import (
    benchmark_png,
    benchmark_rows,
    benchmark_status_line,
    png_chart,
    short_number,
    terminal_chart,
    text_table,
)
from slurmrl.contract.bench_summary import BenchSummary
from slurmrl.contract.metrics import EnvStats, OrchestratorRow, TrainerRow
from slurmrl.errors import UserError
from slurmrl.rundir.atomic import check_target, write_bytes
from slurmrl.rundir.evals import Evaluation
from slurmrl.rundir.metrics import Row
from slurmrl.rundir.paths import RunDir


def _fmt(value, spec: str) -> str | None:
    """A number as ``spec`` says; NaN and infinities as such; None for null or anything not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        if not math.isfinite(value):
            return str(float(value))
        return format(value, spec) if not spec.endswith("f") or abs(value) < 1e15 else format(value, ".4g")
    except (OverflowError, ValueError):
        return str(value)[:20]


def env_words(env: EnvStats | None) -> list[str]:
    """A chat environment's figures of a batch (multi-turn and tool environments): turns, errors, timeouts, cut."""
    if env is None:
        return []
    items = ((env.turns_mean, "turns", ".2f"), (env.errors, "errors", "d"), (env.timeouts, "timeouts", "d"),
             (env.cut, "cut", "d"))
    return [f"{label} {_fmt(value, spec)}" for value, label, spec in items if _fmt(value, spec)]


def trainer_words(t: TrainerRow) -> list[str]:
    """The trainer's figures of a step: loss, KL, entropy, clip, gradient norm, memory, MFU or tokens/s."""
    items = [(t.loss, "loss", ".4g"), (t.kl, "kl", ".3g"), (t.kl_max, "kl max", ".3g"),
             (t.kl_inference, "kl inf", ".3g"), (t.entropy, "entropy", ".3g"), (t.clip_frac, "clip", ".3f"),
             (t.grad_norm, "grad", ".3g")]
    words = [f"{label} {_fmt(value, spec)}" for value, label, spec in items if _fmt(value, spec)]
    if _fmt(t.cuda_mem_peak_gib, ".1f"):
        words.append(f"cuda peak {_fmt(t.cuda_mem_peak_gib, '.1f')} GiB "
                     f"(reserved {_fmt(t.cuda_mem_reserved_gib, '.1f') or '-'})")
    elif _fmt(t.cpu_rss_gib, ".1f"):
        words.append(f"rss {_fmt(t.cpu_rss_gib, '.1f')} GiB")
    if _fmt(t.mfu, ".1%"):
        words.append(f"MFU {_fmt(t.mfu, '.1%')}")
    elif _fmt(t.tokens_per_s, ".0f"):
        words.append(f"{_fmt(t.tokens_per_s, '.0f')} tok/s")
    return words


def training_line(orch: OrchestratorRow | None, trainer: TrainerRow | None) -> str | None:
    """One line from the newest orchestrator and trainer rows: reward, lag, and what debugs RL."""
    if not orch and not trainer:
        return None
    parts = []
    if orch:
        parts.append(f"batch {orch.step}: reward {_fmt(orch.reward_mean, '.3f') or '-'}"
                     f" (std {_fmt(orch.reward_std, '.3f') or '-'}, min {_fmt(orch.reward_min, '.3g') or '-'}"
                     f", max {_fmt(orch.reward_max, '.3g') or '-'}), lag {_fmt(orch.off_policy_lag, 'd') or '-'}")
        env = env_words(orch.env)
        parts[-1] += f", env {', '.join(env)}" if env else ""
    if trainer:
        parts.append(f"trainer step {trainer.step}: " + ", ".join(trainer_words(trainer)))
    return "; ".join(parts)


def eval_line(row: dict | None) -> str | None:
    """One line from the newest evaluation record (metrics/eval.jsonl): step, mean reward, pass@k."""
    if not row or isinstance(row.get("step"), bool) or not isinstance(row.get("step"), int):
        return None
    return Evaluation.of(Row(row["step"], {k: v for k, v in row.items() if k != "step"})).summary()


def eval_table(found: list[Evaluation]) -> list[str]:
    """The evaluations as a text table: step, mean reward, pass@k per k."""
    ks = sorted({k for e in found for k in e.pass_at})
    rows = [["eval step", "reward", *(f"pass@{k}" for k in ks)]]
    for e in found:
        rows.append([str(e.step), _fmt(e.reward_mean, ".3f") or "-", *(_fmt(e.pass_at.get(k), ".3f") or "-" for k in ks)])
    return text_table(rows)


def write_png(png: Path, data: bytes | None) -> None:
    if data is None:
        print("(install matplotlib for the PNG: pip install matplotlib)")
        return
    write_bytes(png, data, umask=None)
    print(f"wrote {png}")


def plot_benchmark(path: Path, summary: BenchSummary) -> int:
    if not summary.points:
        print(benchmark_status_line(summary))
        if summary.error:
            print(f"error: {summary.error}")
        raise UserError(str(path), "the benchmark has no results yet")
    png = RunDir(path).benchmark_plot()
    check_target(png)
    print(benchmark_status_line(summary))
    if summary.error:
        print(f"error: {summary.error}")
    print("\n".join(text_table(benchmark_rows(summary))))
    write_png(png, benchmark_png(summary, f"{path.name}: benchmark"))
    return 0


def plot(run_dir: str) -> int:
    """Everything it shows is read, and where it writes looked at, before a line is printed or drawn."""
    path = Path(run_dir)
    bench = read_benchmark(path)
    paths = RunDir(path)
    if bench is not None and not paths.metrics("orchestrator").exists():
        return plot_benchmark(path, bench)
    points = read_rewards(path)
    if not points:
        raise UserError(str(path), "metrics/orchestrator.jsonl has no steps yet")
    line = training_line(typed(OrchestratorRow.from_json, last_record(paths.metrics("orchestrator"))),
                         typed(TrainerRow.from_json, last_record(paths.metrics("trainer"))))
    trainer = read_typed(TrainerRow.from_json, paths.metrics("trainer"))
    found = read_evaluations(path)
    png = paths.reward_plot()
    check_target(png)
    print(terminal_chart(points))
    first, last = points[: max(1, len(points) // 4)], points[-max(1, len(points) // 4):]
    mean = lambda xs: sum(y / len(xs) for _, y in xs)  # noqa: E731  (each term first: no overflow near 1e308)
    print(f"first quarter mean {short_number(mean(first), 0)} -> last quarter mean {short_number(mean(last), 0)}")
    if line:
        print(f"latest: {line}")
    if found:
        print(f"evaluations ({found[-1].row.split or '?'} split, metrics/eval.jsonl):")
        print("\n".join(eval_table(found)))
    curves = {"eval reward (mean)": [(e.step, e.reward_mean) for e in found if e.reward_mean is not None],
              "eval pass@1": [(e.step, e.pass_at[1]) for e in found if 1 in e.pass_at]}
    write_png(png, png_chart(points, f"{path.name}: reward", trainer, {label: xy for label, xy in curves.items() if xy}))
    return 0


def cmd_plot(args) -> int:
    if is_sweep_dir(args.run_dir):  # every point's reward curve on one chart
        return sweep_report.sweep_plot(args.run_dir)
    return plot(args.run_dir)
