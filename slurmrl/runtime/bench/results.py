"""The benchmark's results as a text table and a PNG: the job's benchmark step prints and writes them
when it finishes, ``slurmrl plot`` shows them again. matplotlib is imported only to draw."""

from __future__ import annotations

import math
from pathlib import Path


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


def text_table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
