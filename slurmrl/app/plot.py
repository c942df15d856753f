"""`slurmrl plot RUN_DIR`: the reward curve of an RL run, in the terminal and as RUN_DIR/reward.png
(with a second panel of the trainer's KL, clip fraction and entropy per step); for a run with a
[benchmark], its results as a table and RUN_DIR/benchmark/benchmark.png. Also the latest training
row `slurmrl status` shows."""

from __future__ import annotations

import math
from pathlib import Path

from slurmrl.app import sweep_report
from slurmrl.app.job_outputs import last_record, read_benchmark, read_evaluations, read_records, read_rewards
from slurmrl.app.sweep_dir import is_sweep_dir
from slurmrl.charts import benchmark_png, benchmark_rows, benchmark_status_line, png_chart, terminal_chart, text_table
from slurmrl.errors import UserError
from slurmrl.rundir.evals import Evaluation
from slurmrl.rundir.metrics import Row
from slurmrl.rundir.paths import RunDir


def _fmt(value, spec: str) -> str | None:
    """A number as ``spec`` says; NaN and infinities as such; None for null or anything not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return format(value, spec) if math.isfinite(value) else str(float(value))
    except (OverflowError, ValueError):
        return str(value)[:20]


ENV_ITEMS = (("env/turns_mean", "turns", ".2f"), ("env/errors", "errors", "d"), ("env/timeouts", "timeouts", "d"),
             ("env/cut", "cut", "d"))


def training_line(orch: dict | None, trainer: dict | None) -> str | None:
    """One line from the newest orchestrator and trainer records: reward, lag, and what debugs RL."""
    if not orch and not trainer:
        return None
    parts = []
    if orch:
        parts.append(f"batch {orch['step']}: reward {_fmt(orch.get('reward_mean'), '.3f') or '-'}"
                     f" (std {_fmt(orch.get('reward_std'), '.3f') or '-'}, min {_fmt(orch.get('reward_min'), '.3g') or '-'}"
                     f", max {_fmt(orch.get('reward_max'), '.3g') or '-'}), lag {_fmt(orch.get('off_policy_lag'), 'd') or '-'}")
        env = [f"{label} {_fmt(orch.get(key), spec)}" for key, label, spec in ENV_ITEMS if _fmt(orch.get(key), spec)]
        parts[-1] += f", env {', '.join(env)}" if env else ""  # multi-turn and tool environments
    if trainer:
        t = trainer
        items = [("loss", "loss", ".4g"), ("kl", "kl", ".3g"), ("kl_max", "kl max", ".3g"),
                 ("kl_inference", "kl inf", ".3g"), ("entropy", "entropy", ".3g"), ("clip_frac", "clip", ".3f"),
                 ("grad_norm", "grad", ".3g")]
        words = [f"{label} {_fmt(t.get(key), spec)}" for key, label, spec in items if _fmt(t.get(key), spec)]
        if _fmt(t.get("cuda_mem_peak_gib"), ".1f"):
            words.append(f"cuda peak {_fmt(t['cuda_mem_peak_gib'], '.1f')} GiB "
                         f"(reserved {_fmt(t.get('cuda_mem_reserved_gib'), '.1f') or '-'})")
        elif _fmt(t.get("cpu_rss_gib"), ".1f"):
            words.append(f"rss {_fmt(t['cpu_rss_gib'], '.1f')} GiB")
        if _fmt(t.get("mfu"), ".1%"):
            words.append(f"MFU {_fmt(t['mfu'], '.1%')}")
        elif _fmt(t.get("tokens_per_s"), ".0f"):
            words.append(f"{_fmt(t['tokens_per_s'], '.0f')} tok/s")
        parts.append(f"trainer step {t['step']}: " + ", ".join(words))
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


def plot_benchmark(path: Path, summary: dict) -> int:
    print(benchmark_status_line(summary))
    if summary.get("error"):
        print(f"error: {summary['error']}")
    if not summary.get("points"):
        raise UserError(str(path), "the benchmark has no results yet")
    print("\n".join(text_table(benchmark_rows(summary))))
    png = RunDir(path).benchmark_plot()
    if benchmark_png(summary, png, f"{path.name}: benchmark"):
        print(f"wrote {png}")
    else:
        print("(install matplotlib for the PNG: pip install matplotlib)")
    return 0


def plot(run_dir: str) -> int:
    path = Path(run_dir)
    bench = read_benchmark(path)
    paths = RunDir(path)
    if bench is not None and not paths.metrics("orchestrator").exists():
        return plot_benchmark(path, bench)
    points = read_rewards(path)
    if not points:
        raise UserError(str(path), "metrics/orchestrator.jsonl has no steps yet")
    print(terminal_chart(points))
    first, last = points[: max(1, len(points) // 4)], points[-max(1, len(points) // 4):]
    mean = lambda xs: sum(y for _, y in xs) / len(xs)  # noqa: E731
    print(f"first quarter mean {mean(first):.3f} -> last quarter mean {mean(last):.3f}")
    png = paths.reward_plot()
    line = training_line(last_record(paths.metrics("orchestrator")), last_record(paths.metrics("trainer")))
    if line:
        print(f"latest: {line}")
    found = read_evaluations(path)
    if found:
        print(f"evaluations ({found[-1].row.values.get('split', '?')} split, metrics/eval.jsonl):")
        print("\n".join(eval_table(found)))
    curves = {"eval reward (mean)": [(e.step, e.reward_mean) for e in found if e.reward_mean is not None],
              "eval pass@1": [(e.step, e.pass_at[1]) for e in found if 1 in e.pass_at]}
    if png_chart(points, png, f"{path.name}: reward", read_records(paths.metrics("trainer")),
                 {label: xy for label, xy in curves.items() if xy}):
        print(f"wrote {png}")
    else:
        print("(install matplotlib for the PNG: pip install matplotlib)")
    return 0


def cmd_plot(args) -> int:
    if is_sweep_dir(args.run_dir):  # every point's reward curve on one chart
        return sweep_report.sweep_plot(args.run_dir)
    return plot(args.run_dir)
