"""`slurmrl plot RUN_DIR`: the reward curve of an RL run, in the terminal and as RUN_DIR/reward.png
(with a second panel of the trainer's KL, clip fraction and entropy per step); for a run with a
[benchmark], its results as a table and RUN_DIR/benchmark/benchmark.png. Also the latest training
row `slurmrl status` shows."""

from __future__ import annotations

import json
import math
from pathlib import Path

from slurmrl import layout
from slurmrl.errors import UserError
from slurmrl.runtime.bench.results import benchmark_png, benchmark_rows, text_table


def read_rewards(run_dir: Path) -> list[tuple[int, float]]:
    path = run_dir / "metrics" / "orchestrator.jsonl"
    if not path.exists():
        raise UserError(str(run_dir), "has no metrics/orchestrator.jsonl (nor benchmark/summary.json) yet: is it "
                                      "an RL run, or a run with a [benchmark], that has started?")
    points = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
            step, reward = rec["step"], rec["reward_mean"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(step, int) and isinstance(reward, (int, float)) and math.isfinite(reward):
            points[step] = float(reward)  # a requeued step overwrites its earlier record
    return sorted(points.items())


def read_records(path: Path) -> dict[int, dict]:
    """Step -> the last record of that step in a metrics JSONL file (a requeued step overwrites)."""
    out: dict[int, dict] = {}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            out[rec["step"]] = rec
    return out


def last_record(path: Path, tail: int = 65536) -> dict | None:
    """The last whole JSON line of a metrics file, reading only its end."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - tail))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            return rec
    return None


def _fmt(value, spec: str) -> str | None:
    return format(value, spec) if isinstance(value, (int, float)) and math.isfinite(value) else None


def training_line(orch: dict | None, trainer: dict | None) -> str | None:
    """One line from the newest orchestrator and trainer records: reward, lag, and what debugs RL."""
    if not orch and not trainer:
        return None
    parts = []
    if orch:
        parts.append(f"batch {orch['step']}: reward {_fmt(orch.get('reward_mean'), '.3f') or '-'}"
                     f" (std {_fmt(orch.get('reward_std'), '.3f') or '-'}, min {_fmt(orch.get('reward_min'), '.3g') or '-'}"
                     f", max {_fmt(orch.get('reward_max'), '.3g') or '-'}), lag {orch.get('off_policy_lag', '-')}")
    if trainer:
        t = trainer
        items = [("loss", "loss", ".4g"), ("kl", "kl", ".3g"), ("kl_max", "kl max", ".3g"),
                 ("kl_inference", "kl inf", ".3g"), ("entropy", "entropy", ".3g"), ("clip_frac", "clip", ".3f"),
                 ("grad_norm", "grad", ".3g")]
        words = [f"{label} {_fmt(t.get(key), spec)}" for key, label, spec in items if _fmt(t.get(key), spec)]
        if _fmt(t.get("cuda_mem_peak_gib"), ".1f"):
            words.append(f"cuda peak {t['cuda_mem_peak_gib']:.1f} GiB (reserved {t.get('cuda_mem_reserved_gib', 0):.1f})")
        elif _fmt(t.get("cpu_rss_gib"), ".1f"):
            words.append(f"rss {t['cpu_rss_gib']:.1f} GiB")
        if _fmt(t.get("mfu"), ".1%"):
            words.append(f"MFU {t['mfu']:.1%}")
        elif _fmt(t.get("tokens_per_s"), ".0f"):
            words.append(f"{t['tokens_per_s']:.0f} tok/s")
        parts.append(f"trainer step {t['step']}: " + ", ".join(words))
    return "; ".join(parts)


DRIFT = (("kl", "KL to reference (mean)"), ("kl_inference", "KL to inference (mean)"), ("clip_frac", "clip fraction"))


def terminal_chart(points: list[tuple[int, float]], width: int = 60, height: int = 12) -> str:
    ys = [y for _, y in points]
    lo, hi = min(ys), max(ys)
    span = (hi - lo) or 1.0
    cols = min(width, len(points))
    grid = [[" "] * cols for _ in range(height)]
    for c in range(cols):
        chunk = points[c * len(points) // cols:(c + 1) * len(points) // cols] or [points[-1]]
        y = sum(v for _, v in chunk) / len(chunk)
        row = height - 1 - round((y - lo) / span * (height - 1))
        grid[row][c] = "*"
    lines = []
    for i, row in enumerate(grid):
        label = f"{hi - i * span / (height - 1):7.3f} |" if i in (0, height // 2, height - 1) else "        |"
        lines.append(label + "".join(row))
    lines.append("        +" + "-" * cols)
    lines.append(f"         step {points[0][0]} .. {points[-1][0]}   (mean reward per step)")
    return "\n".join(lines)


def reward_figure(points: list[tuple[int, float]], title: str, trainer: dict[int, dict] | None = None):
    """The matplotlib figure of the curve; steps are whole numbers, and so are the x ticks. With the
    trainer's records, a second panel below: KL (mean, to the reference and to the inference
    engine), clip fraction, and entropy on its own axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if not trainer:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        axes = [ax]
    else:
        fig, axes = plt.subplots(2, 1, figsize=(7, 7), dpi=100, sharex=True)
        ax = axes[0]
    ax.plot([s for s, _ in points], [y for _, y in points], marker="o", markersize=3)
    ax.set_ylabel("mean reward")
    ax.set_title(title)
    if trainer:
        drift = axes[1]
        steps = sorted(trainer)
        for key, label in DRIFT:
            xy = [(s, trainer[s][key]) for s in steps if _fmt(trainer[s].get(key), "g")]
            if xy:
                drift.plot([x for x, _ in xy], [y for _, y in xy], marker=".", label=label)
        drift.set_ylabel("KL, clip fraction")
        ent = [(s, trainer[s]["entropy"]) for s in steps if _fmt(trainer[s].get("entropy"), "g")]
        if ent:
            right = drift.twinx()
            right.plot([x for x, _ in ent], [y for _, y in ent], color="grey", linestyle="--", label="entropy")
            right.set_ylabel("entropy (nats)")
            right.legend(loc="upper right", fontsize="small")
        drift.legend(loc="upper left", fontsize="small")
        drift.grid(alpha=0.3)
    for a in axes:
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1].set_xlabel("step")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def png_chart(points: list[tuple[int, float]], out: Path, title: str, trainer: dict[int, dict] | None = None) -> bool:
    try:
        import matplotlib.pyplot as plt

        fig = reward_figure(points, title, trainer)
    except ImportError:
        return False
    fig.savefig(out)
    plt.close(fig)
    return True


# ---- benchmark results (slurmrl.runtime.bench writes them; table and PNG: bench.results) -----------
def read_benchmark(run_dir: Path) -> dict | None:
    """RUN_DIR/benchmark/summary.json, or None when there is none (or it cannot be read)."""
    try:
        summary = json.loads(layout.benchmark_summary(run_dir).read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and isinstance(summary.get("points"), list) else None


def benchmark_status_line(summary: dict) -> str:
    """One line: the benchmark's state (running, done, failed, stopped), its points, its target."""
    points, planned = len(summary.get("points", [])), summary.get("planned_points")
    of = f"/{planned}" if planned else ""
    line = f"benchmark: {summary.get('status', '?')}, {points}{of} point(s)"
    if summary.get("target"):
        line += f" against {summary['target']}"
    return line


def plot_benchmark(path: Path, summary: dict) -> int:
    print(benchmark_status_line(summary))
    if summary.get("error"):
        print(f"error: {summary['error']}")
    if not summary.get("points"):
        raise UserError(str(path), "the benchmark has no results yet")
    print("\n".join(text_table(benchmark_rows(summary))))
    png = layout.benchmark_plot(path)
    if benchmark_png(summary, png, f"{path.name}: benchmark"):
        print(f"wrote {png}")
    else:
        print("(install matplotlib for the PNG: pip install matplotlib)")
    return 0


def plot(run_dir: str) -> int:
    path = Path(run_dir)
    bench = read_benchmark(path)
    if bench is not None and not (path / "metrics" / "orchestrator.jsonl").exists():
        return plot_benchmark(path, bench)
    points = read_rewards(path)
    if not points:
        raise UserError(str(path), "metrics/orchestrator.jsonl has no steps yet")
    print(terminal_chart(points))
    first, last = points[: max(1, len(points) // 4)], points[-max(1, len(points) // 4):]
    mean = lambda xs: sum(y for _, y in xs) / len(xs)  # noqa: E731
    print(f"first quarter mean {mean(first):.3f} -> last quarter mean {mean(last):.3f}")
    png = path / "reward.png"
    line = training_line(last_record(path / "metrics" / "orchestrator.jsonl"),
                         last_record(path / "metrics" / "trainer.jsonl"))
    if line:
        print(f"latest: {line}")
    if png_chart(points, png, f"{path.name}: reward", read_records(path / "metrics" / "trainer.jsonl")):
        print(f"wrote {png}")
    else:
        print("(install matplotlib for the PNG: pip install matplotlib)")
    return 0
