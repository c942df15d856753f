"""`slurmrl plot RUN_DIR`: the reward curve of an RL run, in the terminal and as RUN_DIR/reward.png."""

from __future__ import annotations

import json
import math
from pathlib import Path

from slurmrl.errors import UserError


def read_rewards(run_dir: Path) -> list[tuple[int, float]]:
    path = run_dir / "metrics" / "orchestrator.jsonl"
    if not path.exists():
        raise UserError(str(run_dir), "has no metrics/orchestrator.jsonl yet (is it an RL run that has started?)")
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


def plot(run_dir: str) -> int:
    path = Path(run_dir)
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
