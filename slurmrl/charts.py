"""Charts and tables of a run's numbers: terminal charts, text tables, and PNGs through matplotlib
(imported only when a PNG is drawn). A leaf: `slurmrl plot`/`status` and the benchmark runtime
(slurmrl.runtime.bench) both draw with it; it reads no file."""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

from slurmrl.contract.bench_summary import BenchSummary
from slurmrl.contract.metrics import TrainerRow


def finite(value, spec: str) -> str | None:
    """``value`` formatted with ``spec`` when it is a finite number, else None."""
    return format(value, spec) if isinstance(value, (int, float)) and math.isfinite(value) else None


def pyplot():
    """matplotlib's pyplot on the Agg backend (no display), imported when a PNG is drawn; ImportError without it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


DRIFT: tuple[tuple[Callable[[TrainerRow], Any], str], ...] = (
    (lambda r: r.kl, "KL to reference (mean)"), (lambda r: r.kl_inference, "KL to inference (mean)"),
    (lambda r: r.clip_frac, "clip fraction"))


LARGEST_PLOTTED = 1e300  # matplotlib places no ticks on an axis spanning ~1e308: past this, a power of ten


def fit_axes(fig) -> None:
    """Every axis of ``fig`` whose finite data reach past LARGEST_PLOTTED is drawn in units of a power
    of ten (named in its label): numbers at the limits of a float are drawn, never a crash."""
    for ax in fig.axes:
        lines, bars = ax.get_lines(), list(ax.patches)
        values = [float(v) for line in lines for v in line.get_ydata()]
        values += [float(v) for p in bars for v in (p.get_y(), p.get_y() + p.get_height())]
        big = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
        if big <= LARGEST_PLOTTED:
            continue
        power = math.floor(math.log10(big))
        unit = 10.0 ** power
        for line in lines:
            line.set_ydata([float(v) / unit for v in line.get_ydata()])
        for p in bars:
            p.set_y(p.get_y() / unit)
            p.set_height(p.get_height() / unit)
        ax.relim()
        ax.autoscale_view()
        ax.set_ylabel(f"{ax.get_ylabel()} (x 1e{power})")


def short_number(value: float, width: int = 7) -> str:
    """``.3f``, or ``.3g`` from a million up (1e308 is not 309 digits)."""
    return f"{value:{width}.3f}" if abs(value) < 1e6 else f"{value:{width}.3g}"


def terminal_chart(points: list[tuple[int, float]], width: int = 60, height: int = 12) -> str:
    """The curve in text; finite numbers of any size (differences that overflow a float are taken in
    units of the largest value)."""
    unit = max((abs(y) for _, y in points), default=1.0) or 1.0
    zs = [y / unit for _, y in points]  # within [-1, 1]: no sum or difference below overflows
    lo, hi = min(zs), max(zs)
    span = (hi - lo) or 1.0
    cols = min(width, len(points))
    grid = [[" "] * cols for _ in range(height)]
    for c in range(cols):
        chunk = zs[c * len(points) // cols:(c + 1) * len(points) // cols] or [zs[-1]]
        y = sum(chunk) / len(chunk)
        row = height - 1 - round((y - lo) / span * (height - 1))
        grid[row][c] = "*"
    lines = []
    for i, cells in enumerate(grid):
        value = (hi - i * span / (height - 1)) * unit
        label = f"{short_number(value)} |" if i in (0, height // 2, height - 1) else "        |"
        lines.append(label + "".join(cells))
    lines.append("        +" + "-" * cols)
    lines.append(f"         step {points[0][0]} .. {points[-1][0]}   (mean reward per step)")
    return "\n".join(lines)


def reward_figure(points: list[tuple[int, float]], title: str, trainer: dict[int, TrainerRow] | None = None,
                  evals: dict[str, list[tuple[int, float]]] | None = None):
    """The matplotlib figure of the curve; steps are whole numbers, and so are the x ticks. With the
    trainer's records, a second panel below: KL (mean, to the reference and to the inference
    engine), clip fraction, and entropy on its own axis. ``evals``: labelled evaluation curves
    (held-out reward, pass@1) drawn over the training reward."""
    plt = pyplot()
    MaxNLocator = plt.MaxNLocator  # noqa: N806

    if not trainer:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        axes = [ax]
    else:
        fig, axes = plt.subplots(2, 1, figsize=(7, 7), dpi=100, sharex=True)
        ax = axes[0]
    ax.plot([s for s, _ in points], [y for _, y in points], marker="o", markersize=3, label="training reward")
    for label, xy in (evals or {}).items():
        ax.plot([s for s, _ in xy], [y for _, y in xy], marker="s", markersize=4, linestyle="--", label=label)
    if evals:
        ax.legend(loc="lower right", fontsize="small")
    ax.set_ylabel("mean reward")
    ax.set_title(title)
    if trainer:
        drift = axes[1]
        steps = sorted(trainer)
        tall: list[tuple[float, float]] = []
        for get, label in DRIFT:
            xy = [(s, get(trainer[s])) for s in steps if finite(get(trainer[s]), "g")]
            if xy:
                drift.plot([x for x, _ in xy], [y for _, y in xy], marker=".", label=label)
                tall += xy
        clip_axis(drift, usual_top([y for _, y in tall]), tall)  # a KL spike does not flatten the rest
        drift.set_ylabel("KL, clip fraction")
        ent = [(s, trainer[s].entropy) for s in steps if finite(trainer[s].entropy, "g")]
        if ent:
            right = drift.twinx()
            right.plot([x for x, _ in ent], [y for _, y in ent], color="grey", linestyle="--", label="entropy")
            right.set_ylabel("entropy (nats)")
            right.legend(loc="upper right", fontsize="small")
        if drift.get_legend_handles_labels()[0]:
            drift.legend(loc="upper left", fontsize="small")
        drift.grid(alpha=0.3)
    for a in axes:
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1].set_xlabel("step")
    ax.grid(alpha=0.3)
    fit_axes(fig)
    fig.tight_layout()
    return fig


def png(fig) -> bytes:
    """``fig`` as PNG bytes (the caller writes them: slurmrl.rundir.atomic), the figure closed."""
    plt = pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def png_chart(points: list[tuple[int, float]], title: str, trainer: dict[int, TrainerRow] | None = None,
              evals: dict[str, list[tuple[int, float]]] | None = None) -> bytes | None:
    """The reward chart as PNG bytes; None without matplotlib."""
    try:
        return png(reward_figure(points, title, trainer, evals))
    except ImportError:
        return None


def curves_png(curves: list[tuple[str, list[tuple[int, float]]]], title: str) -> bytes | None:
    """Several labelled reward curves on one chart (a sweep's points) as PNG bytes; None without matplotlib."""
    try:
        plt = pyplot()
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for label, pts in curves:
        ax.plot([s for s, _ in pts], [y for _, y in pts], marker="o", markersize=3, label=label)
    ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fit_axes(fig)
    fig.tight_layout()
    return png(fig)


# ---- benchmark results (slurmrl.runtime.bench writes them) -------------------------------------
def _num(value, digits: int = 1) -> str:
    """A figure of the benchmark's table: fixed point, or 4 significant digits past 1e15; '-' when missing."""
    if not _finite(value):
        return "-"
    return f"{value:.{digits}f}" if abs(value) < 1e15 else f"{value:.4g}"


def benchmark_rows(summary: BenchSummary) -> list[list[str]]:
    """A header and one row per point: throughput and the latency medians and p99s (ms); with goodput
    targets, the good requests per second and their share. A replay's lengths (the summary's mode) and a
    point without a concurrency cap read "trace" and "-"."""
    points = summary.points
    goodput = any("request_goodput" in p for p in points)
    rows = [["conc", "in", "out", "req/s", "out tok/s", "total tok/s", "TTFT p50/p99", "TPOT p50/p99",
             "ITL p50/p99", *(["good req/s"] if goodput else []), "failed"]]
    for p in points:
        rows.append([
            _whole(p.get("concurrency")), *(["trace", "trace"] if summary.replay else
                                             [_whole(p.get("input_len")), _whole(p.get("output_len"))]),
            _num(p.get("request_throughput"), 2), _num(p.get("output_throughput")),
            _num(p.get("total_token_throughput")),
            *(f"{_num(p.get(f'{m}_p50_ms'))}/{_num(p.get(f'{m}_p99_ms'))}" for m in ("ttft", "tpot", "itl")),
            *([_good(p)] if goodput else []),
            f"{_whole(p.get('failed', 0))}/{_whole(p.get('num_prompts'))}",
        ])
    return rows


def _whole(value) -> str:
    """A whole number as written; '-' for anything else (the reader makes a value out of range null)."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else "-"


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _good(p: dict) -> str:
    share = p.get("good_share")
    pct = f" ({100 * share:.0f}%)" if isinstance(share, (int, float)) and math.isfinite(share) else ""
    return _num(p.get("request_goodput"), 2) + pct


BENCH_PANELS = (("output_throughput", "output tokens/s"), ("ttft_p50_ms", "TTFT p50 (ms)"),
                ("tpot_p50_ms", "TPOT p50 (ms)"))


def benchmark_figure(summary: BenchSummary, title: str):
    """Output throughput, TTFT and TPOT medians against concurrency, one line per (input, output) length."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), dpi=100)
    concurrencies = sorted({p["concurrency"] for p in summary.points if isinstance(p.get("concurrency"), int)})
    series: dict[tuple, list[dict]] = {}
    for p in summary.points:
        series.setdefault((p.get("input_len"), p.get("output_len")), []).append(p)
    for ax, (key, label) in zip(axes, BENCH_PANELS):
        for (i, o), points in series.items():
            name = summary.series_name(i, o)
            uncapped = [p for p in points if p.get("concurrency") is None and _finite(p.get(key))]
            for p in uncapped:  # a trace replayed without a cap: one value, across the whole axis
                ax.axhline(p[key], linestyle="--", linewidth=1, label=f"{name}, no cap")
            points = sorted((p for p in points if isinstance(p.get("concurrency"), int) and _finite(p.get(key))),
                            key=lambda p: p["concurrency"])
            ax.plot([p["concurrency"] for p in points], [p[key] for p in points], marker="o", markersize=3,
                    label=name)
        ax.set_xscale("log", base=2)
        ticks = concurrencies or [1]
        ax.set_xlim(ticks[0] / 1.5, ticks[-1] * 1.5)  # positive limits: lines without a cap span any axis
        ax.set_xticks(ticks)  # the grid's own concurrencies, as whole numbers
        ax.xaxis.set_major_formatter(plt.ScalarFormatter())
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_xlabel("concurrency")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    fig.suptitle(title)
    fit_axes(fig)
    fig.tight_layout()
    return fig


def benchmark_png(summary: BenchSummary, title: str) -> bytes | None:
    """The benchmark's chart as PNG bytes; None without matplotlib."""
    try:
        return png(benchmark_figure(summary, title))
    except ImportError:
        return None


def benchmark_status_line(summary: BenchSummary) -> str:
    """One line: the benchmark's state (running, done, failed, stopped), its points, its target."""
    points, planned = len(summary.points), summary.planned_points
    of = f"/{planned}" if planned else ""
    line = f"benchmark: {summary.status}, {points}{of} point(s)"
    if summary.target:
        line += f" against {summary.target}"
    return line


def text_table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


# ---- scales that keep the usual range readable ----------------------------------------------------
def usual_top(values: list[float]) -> float | None:
    """Where to cut the y axis so that a few tall values (a 657 s step, a KL spike of 17) do not flatten
    the rest: None when nothing stands out (the tallest is under 3x the 80th percentile)."""
    vals = sorted(v for v in values if math.isfinite(v))
    if len(vals) < 4:
        return None
    p80 = vals[min(len(vals) - 1, int(0.8 * (len(vals) - 1) + 0.5))]
    if p80 <= 0 or vals[-1] <= 3 * p80:
        return None
    kept = [v for v in vals if v <= 3 * p80]
    return 1.25 * max(kept) if kept else None


def clip_axis(ax, top: float | None, tall: list[tuple[float, float]]) -> bool:
    """Cut ``ax`` at ``top``; each value past it is a triangle at the edge with its number beside it
    (neighbours' numbers staggered), and the legend says what the triangle means. True when cut."""
    if top is None:
        return False
    lo = min([y for _, y in tall if y <= top] or [0.0])
    bottom = lo - 0.05 * (top - lo) if lo != 0 else 0.0
    if not max(abs(bottom), abs(top)) <= LARGEST_PLOTTED or bottom >= top:  # values at a float's limits: fit_axes
        return False
    ax.set_ylim(bottom, top)  # the usual range, not the spike's margins
    past = sorted((x, y) for x, y in tall if y > top)
    for i, (x, y) in enumerate(past):
        ax.plot([x], [top], marker="^", color="black", markersize=6, clip_on=False, zorder=5)
        ax.annotate(f"{y:.3g}", (x, top), xytext=(5, -11 - 10 * (i % 2)), textcoords="offset points", fontsize=7,
                    bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})
    ax.plot([], [], "^", color="black", markersize=6, label="past the top: its value written")
    return True


# ---- `slurmrl report`: panels of time series, stacked bars, and the phases of every attempt --------
Series = tuple[str, list[float], list[float]]  # label, x values, y values (NaN: a gap, nothing there)
Panel = tuple[str, list[Series], str]  # y label, its series, "line" or "stack" (stacked bars per x)


def has_data(series: list[Series]) -> bool:
    return any(any(math.isfinite(y) for y in ys) for _, _, ys in series)


def save(fig, key: str) -> tuple[bytes, str]:
    """``fig`` as PNG bytes and as SVG text whose words are text (a browser lays them out; a test reads
    them), ids unique to ``key``; the figure closed."""
    plt = pyplot()
    buf = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": key}):
        fig.savefig(buf, format="svg")
    svg = buf.getvalue()
    return png(fig), svg[svg.index("<svg"):].replace('id="', f'id="{key}-').replace("url(#", f"url(#{key}-")


def panels_figure(title: str, panels: list[Panel], xlabel: str):
    """The figure of panels one above the other, sharing the x axis; None without data or matplotlib.
    A line breaks where a value is NaN (nothing there); tall values are cut (``usual_top``)."""
    panels = [p for p in panels if has_data(p[1])]
    if not panels:
        return None
    try:
        plt = pyplot()
    except ImportError:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.6 * len(panels) + 0.8), dpi=100, sharex=True,
                             squeeze=False)
    for ax, (ylabel, series, kind) in zip(axes[:, 0], panels):
        bottom: dict[float, float] = {}
        tall: list[tuple[float, float]] = []
        for label, xs, ys in series:
            if not xs:
                continue
            if kind == "stack":
                below = [bottom.get(x, 0.0) for x in xs]
                ax.bar(xs, ys, bottom=below, label=label, width=0.8)
                for x, y in zip(xs, ys):
                    bottom[x] = bottom.get(x, 0.0) + y
            else:
                dashed = label.startswith("eval")
                ax.plot(xs, ys, marker="s" if dashed else "." if len(xs) < 60 else None, markersize=5 if dashed else 6,
                        linestyle="--" if dashed else "-", label=label)
                tall += [(x, y) for x, y in zip(xs, ys) if math.isfinite(y)]
        tall = list(bottom.items()) if kind == "stack" else tall
        cut = clip_axis(ax, usual_top([y for _, y in tall]), tall)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if len(series) > 1 or kind == "stack" or cut:
            ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    axes[-1, 0].set_xlabel(xlabel)
    axes[0, 0].set_title(title)
    fit_axes(fig)
    fig.tight_layout()
    return fig


def timeline_figure(title: str, rows: list[tuple[str, list[tuple[float, str]]]], xlabel: str):
    """The phases of every attempt on one time axis: one line per phase (its words on the left, a dot
    at its time), the attempts one after the other, so that no two labels share a line."""
    rows = [r for r in rows if r[1]]
    if not rows:
        return None
    try:
        plt = pyplot()
    except ImportError:
        return None
    lines = [(f"{label}: {text[:70]}", x, i) for i, (label, events) in enumerate(rows) for x, text in events]
    fig, ax = plt.subplots(figsize=(11, 1.3 + 0.24 * len(lines)), dpi=100)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for y, (_, x, attempt) in enumerate(lines):
        ax.plot([x], [y], "o", markersize=4, color=colours[attempt % len(colours)])
    for i, (label, events) in enumerate(rows):
        first = sum(len(e) for _, e in rows[:i])
        ax.hlines(range(first, first + len(events)), min(x for x, _ in events), [x for x, _ in events],
                  color=colours[i % len(colours)], alpha=0.3)
    ax.set_yticks(range(len(lines)))
    ax.set_yticklabels([text for text, _, _ in lines], fontsize=7)
    ax.set_ylim(len(lines) - 0.5, -0.5)  # the first phase on top
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="x")
    fit_axes(fig)
    fig.tight_layout()
    return fig
