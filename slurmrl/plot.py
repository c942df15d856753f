"""`slurmrl plot RUN_DIR`: the reward curve of an RL run, in the terminal and as RUN_DIR/reward.png;
for a run with a [benchmark], its results as a table and RUN_DIR/benchmark/benchmark.png."""

from __future__ import annotations

import json
import math
from pathlib import Path

from slurmrl import layout
from slurmrl.errors import UserError


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


def reward_figure(points: list[tuple[int, float]], title: str):
    """The matplotlib figure of the curve; steps are whole numbers, and so are the x ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot([s for s, _ in points], [y for _, y in points], marker="o", markersize=3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def png_chart(points: list[tuple[int, float]], out: Path, title: str) -> bool:
    try:
        import matplotlib.pyplot as plt

        fig = reward_figure(points, title)
    except ImportError:
        return False
    fig.savefig(out)
    plt.close(fig)
    return True


# ---- benchmark results (slurmrl.runtime.bench writes them) -------------------------------------
def read_benchmark(run_dir: Path) -> dict | None:
    """RUN_DIR/benchmark/summary.json, or None when there is none (or it cannot be read)."""
    try:
        summary = json.loads(layout.benchmark_summary(run_dir).read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and isinstance(summary.get("points"), list) else None


def _num(value, digits: int = 1) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def benchmark_rows(summary: dict) -> list[list[str]]:
    """A header and one row per grid point: throughput and the latency medians and p99s (ms)."""
    rows = [["conc", "in", "out", "req/s", "out tok/s", "total tok/s", "TTFT p50/p99", "TPOT p50/p99",
             "ITL p50/p99", "failed"]]
    for p in summary.get("points", []):
        rows.append([
            str(p.get("concurrency", "-")), str(p.get("input_len", "-")), str(p.get("output_len", "-")),
            _num(p.get("request_throughput"), 2), _num(p.get("output_throughput")),
            _num(p.get("total_token_throughput")),
            *(f"{_num(p.get(f'{m}_p50_ms'))}/{_num(p.get(f'{m}_p99_ms'))}" for m in ("ttft", "tpot", "itl")),
            f"{p.get('failed', 0)}/{p.get('num_prompts', '-')}",
        ])
    return rows


def benchmark_figure(summary: dict, title: str):
    """Output throughput, TTFT and TPOT medians against concurrency, one line per (input, output) length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, axes = plt.subplots(1, 3, figsize=(13, 4), dpi=100)
    concurrencies = sorted({p["concurrency"] for p in summary.get("points", []) if isinstance(p.get("concurrency"), int)})
    series: dict[tuple, list[dict]] = {}
    for p in summary.get("points", []):
        series.setdefault((p.get("input_len"), p.get("output_len")), []).append(p)
    panels = (("output_throughput", "output tokens/s"), ("ttft_p50_ms", "TTFT p50 (ms)"),
              ("tpot_p50_ms", "TPOT p50 (ms)"))
    for ax, (key, label) in zip(axes, panels):
        for (i, o), points in series.items():
            points = sorted((p for p in points if isinstance(p.get(key), (int, float))),
                            key=lambda p: p["concurrency"])
            ax.plot([p["concurrency"] for p in points], [p[key] for p in points], marker="o", markersize=3,
                    label=f"in {i} / out {o}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(concurrencies)  # the grid's own concurrencies, as whole numbers
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("concurrency")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def benchmark_png(summary: dict, out: Path, title: str) -> bool:
    try:
        import matplotlib.pyplot as plt

        fig = benchmark_figure(summary, title)
    except ImportError:
        return False
    fig.savefig(out)
    plt.close(fig)
    return True


def benchmark_status_line(summary: dict) -> str:
    """One line: the benchmark's state (running, done, failed, stopped), its points, its target."""
    points, planned = len(summary.get("points", [])), summary.get("planned_points")
    of = f"/{planned}" if planned else ""
    line = f"benchmark: {summary.get('status', '?')}, {points}{of} point(s)"
    if summary.get("target"):
        line += f" against {summary['target']}"
    return line


def text_table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


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
    if png_chart(points, png, f"{path.name}: reward"):
        print(f"wrote {png}")
    else:
        print("(install matplotlib for the PNG: pip install matplotlib)")
    return 0
