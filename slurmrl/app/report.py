"""`slurmrl report RUN_DIR`: one self-contained HTML page, RUN_DIR/report/index.html (no server: the
charts are inside it as SVG whose words are text, and beside it as PNGs), from what the job left in
its run dir: throughput and latency (TTFT, inter-token latency) of every vLLM server, their queues and
KV-cache use, the GPUs, the RL step's time split, reward / KL / eval curves, weight-sync time, the
benchmark, and the phases of every attempt on one time axis (``slurmrl.app.report_data`` computes,
``slurmrl.charts`` draws). Only the panels the job has data for are there; one line says what was not
collected. Under each panel, its numbers (a table a user and a test can read against the run dir).
On a sweep dir: every point's report, and SWEEP_DIR/report/index.html with the points side by side.
"""

from __future__ import annotations

import base64
import html
import math
import time
from pathlib import Path
from typing import NamedTuple

from slurmrl import charts
from slurmrl.app import report_data as rd
from slurmrl.app.job_outputs import failed_reason, read_benchmark
from slurmrl.app.sweep_dir import is_sweep_dir
from slurmrl.contract.bench_summary import BenchSummary
from slurmrl.errors import UserError
from slurmrl.rundir.atomic import check_target, write_bytes, write_text
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import read_bytes
from slurmrl.rundir.sweep_index import read_index

XLABEL = "seconds since the job started"
STYLE = ("body{font-family:sans-serif;margin:1.5em;max-width:1400px}img{max-width:100%;border:1px solid #ddd}"
         "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}"
         "th{background:#f4f4f4}.none{color:#777}section{margin-bottom:2em}figure{margin:0}svg{max-width:100%;height:auto}"
         "table.numbers td{text-align:left;font-family:monospace;font-size:small}")


def _short(label: str) -> str:
    return label.removeprefix("attempt-0/")


def serving_panels(d: rd.RunData) -> dict[str, list[charts.Panel]]:
    """Panel name -> its subplots, from the servers' (and GPUs') scrapes."""
    def each(fn) -> list[charts.Series]:
        out = []
        for label, s in d.servers.items():
            pts = fn(s)
            out.append((_short(label), [d.x(t) for t, _ in pts], [v for _, v in pts]))
        return out

    panels = {
        "throughput": [("generated tokens/s", each(lambda s: rd.rate(rd.summed(s, rd.GENERATION))), "line"),
                       ("prompt tokens/s", each(lambda s: rd.rate(rd.summed(s, rd.PROMPT))), "line")],
        "latency": [("TTFT (s): window mean", each(lambda s: rd.hist_mean(s, rd.TTFT)), "line"),
                    ("inter-token latency (s):\nwindow mean", each(lambda s: rd.hist_mean(s, rd.ITL)), "line")],
        "queue-kv": [("requests running", each(lambda s: rd.summed(s, rd.RUNNING)), "line"),
                     ("requests waiting", each(lambda s: rd.summed(s, rd.WAITING)), "line"),
                     ("KV cache used (0-1)", each(lambda s: rd.summed(s, rd.KV)), "line")],
    }
    gpu: list[charts.Panel] = []
    for name, ylabel in (("gpu_utilization_percent", "GPU utilisation (%)"), ("gpu_memory_used_mib", "GPU memory (MiB)")):
        series = []
        for label, s in d.gpus.items():
            for key in s.keys(name):
                pts = s.series(key)
                series.append((f"{_short(label)} {key.removeprefix(name)}", [d.x(t) for t, _ in pts], [v for _, v in pts]))
        gpu.append((ylabel, series, "line"))
    panels["gpus"] = gpu
    return panels


def training_panels(d: rd.RunData) -> dict[str, list[charts.Panel]]:
    def split(records: dict, fields) -> list[charts.Series]:
        return [(label, *rd.step_field(records, get)) for get, label in fields]

    eval_rewards, passes = rd.eval_series(d.evals)
    orch, trainer = d.orchestrator, d.trainer
    return {
        "step-split": [("orchestrator, s per step", split(orch, rd.ORCHESTRATOR_SPLIT), "stack"),
                       ("trainer, s per step", split(trainer, rd.TRAINER_SPLIT), "stack")],
        "curves": [("reward (mean)", [("training reward", *rd.step_field(orch, lambda r: r.reward_mean)),
                                      *eval_rewards], "line"),
                   ("KL", [("kl", *rd.step_field(trainer, lambda r: r.kl)),
                           ("kl_inference", *rd.step_field(trainer, lambda r: r.kl_inference))], "line"),
                   ("eval pass@k", passes, "line"),
                   ("tokens/s", [("orchestrator (generate)", *rd.step_field(orch, lambda r: r.tokens_per_s)),
                                 ("trainer", *rd.step_field(trainer, lambda r: r.tokens_per_s))], "line")],
        "weight-sync": [("seconds per step", [("trainer: publish", *rd.step_field(trainer, lambda r: r.publish_s)),
                                              ("servers: load new weights", *rd.step_field(orch, lambda r: r.reload_s))],
                         "line")],
    }


TITLES = {
    "phases": "Phases of every attempt", "throughput": "Throughput per server", "latency": "Latency per server",
    "queue-kv": "Queue and KV cache per server", "gpus": "GPUs of the collector's node",
    "step-split": "The RL step's time split", "curves": "Reward, KL, eval and tokens/s",
    "weight-sync": "Weight sync", "benchmark": "Benchmark",
}
NOT_COLLECTED = {  # what a missing panel means, said once
    "phases": "phases (no logs/attempt-N/phases)",
    "throughput": "vLLM servers' metrics (no [collector] section, or it scraped no server)",
    "gpus": "GPUs (no nvidia-smi on the collector's node, or no [collector])",
    "step-split": "RL step records (metrics/orchestrator.jsonl, metrics/trainer.jsonl: not an RL job)",
    "benchmark": "benchmark (no [benchmark] section)",
}
SAME_SOURCE = {"latency": "throughput", "queue-kv": "throughput", "curves": "step-split", "weight-sync": "step-split"}
LATENCY_NOTE = ("Each point is a window's mean: the mean over the requests that finished (TTFT: got their first "
                "token) between two scrapes, drawn at the window's end; a gap is a window in which none did. "
                "The table: quantiles over each server's life.")


class Drawn(NamedTuple):
    png: bytes  # the chart as PNG, written beside the page
    svg: str  # the same chart as SVG text, for the page
    panels: list[charts.Panel]  # what it draws: the numbers under it


def chart_path(out_dir: Path, key: str) -> Path:
    return out_dir / (RunDir.BENCHMARK_PLOT if key == "benchmark" else f"{key}.png")


def draw(d: rd.RunData, bench: BenchSummary | None) -> dict[str, Drawn | None]:
    """Every panel's PNG and SVG, in memory (None where there is nothing to draw)."""
    name = d.run.name
    made: dict[str, Drawn | None] = {}
    rows = [(f"attempt {a}", [(d.x(t), what) for t, what in events]) for a, events in d.phases]
    fig = charts.timeline_figure(f"{name}: phases", rows, XLABEL)
    phases: list[charts.Panel] = [(label, [(what, [x], []) for x, what in ev], "line") for label, ev in rows]
    made["phases"] = Drawn(*charts.save(fig, "phases"), phases) if fig else None
    for key, panels in {**serving_panels(d), **training_panels(d)}.items():
        xlabel = "step" if key in ("step-split", "curves", "weight-sync") else XLABEL
        fig = charts.panels_figure(f"{name}: {TITLES[key]}", panels, xlabel)
        made[key] = Drawn(*charts.save(fig, key), [p for p in panels if charts.has_data(p[1])]) if fig else None
    made["benchmark"] = None
    if bench and bench.points:
        made["benchmark"] = Drawn(*charts.save(charts.benchmark_figure(bench, f"{name}: benchmark"), "benchmark"),
                                  bench_panels(bench))
    return made


def write_charts(made: dict[str, Drawn | None], out_dir: Path) -> None:
    """Each chart beside the page; an earlier report's chart of data now gone is removed."""
    for key, drawn in made.items():
        if drawn is not None:
            write_bytes(chart_path(out_dir, key), drawn.png, umask=None)
        else:
            chart_path(out_dir, key).unlink(missing_ok=True)


def targets(run: RunDir) -> list[Path]:
    """Every file a report of ``run`` writes (or removes): looked at before anything is drawn."""
    return [*(chart_path(run.report_dir(), key) for key in TITLES), run.report_page()]


def bench_panels(summary: BenchSummary) -> list[charts.Panel]:
    """The benchmark's numbers as drawn: per metric, one series per (input, output) length against concurrency."""
    lengths = sorted({(p.get("input_len"), p.get("output_len")) for p in summary.points}, key=str)
    out: list[charts.Panel] = []
    for key, label in charts.BENCH_PANELS:
        series: list[charts.Series] = []
        for i, o in lengths:
            pts = sorted((p["concurrency"], float(p[key])) for p in summary.points
                         if (p.get("input_len"), p.get("output_len")) == (i, o) and isinstance(p.get(key), (int, float))
                         and isinstance(p.get("concurrency"), int))
            name = summary.series_name(i, o)
            series.append((name, [float(c) for c, _ in pts], [v for _, v in pts]))
        out.append((label, series, "line"))
    return out


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(read_bytes(path)).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _num(v: float) -> str:
    return f"{v:.6g}" if math.isfinite(v) else "-"


def numbers(key: str, panels: list[charts.Panel]) -> str:
    """The panel's numbers, one row per series: what it draws, to read against the run dir's files."""
    rows = []
    for ylabel, series, _ in panels:
        for label, xs, ys in series:
            if xs:
                rows.append(f'<tr><th>{html.escape(ylabel.replace(chr(10), " "))}</th><th>{html.escape(label)}</th>'
                            f'<td class="x">{" ".join(map(_num, xs))}</td><td class="y">{" ".join(map(_num, ys))}</td></tr>')
    if not rows:
        return ""
    return (f'<details><summary>numbers</summary><table class="numbers" data-panel="{key}"><tr><th>chart</th>'
            f'<th>series</th><th>x</th><th>y ("-": nothing there)</th></tr>{"".join(rows)}</table></details>')


def latency_table(d: rd.RunData) -> str:
    rows = []
    for label, s in d.servers.items():
        cells = []
        for names in (rd.TTFT, rd.ITL):
            q = rd.hist_quantiles(s, names) or {}
            cells += [f"{q[x] * 1000:.1f}" if x in q else "-" for x in rd.QUANTILES]
        rows.append(f"<tr><th>{html.escape(_short(label))}</th>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    if not rows:
        return ""
    head = "".join(f"<th>{m} p{int(q * 100)} (ms)</th>" for m in ("TTFT", "ITL") for q in rd.QUANTILES)
    return f'<table id="latency-quantiles"><tr><th>server</th>{head}</tr>{"".join(rows)}</table>'


def page(title: str, body: list[str]) -> str:
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>\n<h1>{html.escape(title)}</h1>\n" + "\n".join(body)
            + "\n</body></html>\n")


def run_report(run_dir: Path) -> Path:
    """Draw and write RUN_DIR/report/index.html; returns its path. What it reads is read, and where it
    writes is looked at, before anything is drawn."""
    run = RunDir(run_dir)
    d = rd.read_run(run)
    bench = read_benchmark(run.path)
    failed = [(a, failed_reason(run.path, a)) for a, _ in d.phases]
    for path in targets(run):
        check_target(path)
    made = draw(d, bench)
    body = [f"<p>run dir <code>{html.escape(str(run.path))}</code>, report of "
            f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {len(d.phases)} attempt(s), "
            f"{len(d.servers)} vLLM server scrape file(s), {len(d.orchestrator)} orchestrator and "
            f"{len(d.trainer)} trainer step(s).</p>"]
    if d.through():
        body.append(f'<p class="restarts" id="restarts">{html.escape(d.through() or "")}</p>')
    body += [f'<p class="failed">attempt {a} FAILED: {html.escape(why)}</p>' for a, why in failed if why]
    missing = [NOT_COLLECTED[SAME_SOURCE.get(k, k)] for k in TITLES if made.get(k) is None]
    if missing:
        body.append(f'<p class="none" id="not-collected">Not collected: {html.escape("; ".join(dict.fromkeys(missing)))}.</p>')
    for key, title in TITLES.items():
        drawn = made.get(key)
        if drawn is None:
            continue
        inner = f'<figure role="img" aria-label="{html.escape(title)}">{drawn.svg}</figure>' + numbers(key, drawn.panels)
        if key == "latency":
            inner = f'<p class="note">{html.escape(LATENCY_NOTE)}</p>' + inner + latency_table(d)
        body.append(f'<section id="panel-{key}"><h2>{html.escape(title)}</h2>{inner}</section>')
    write_charts(made, run.report_dir())
    out = run.report_page()
    write_text(out, page(f"slurmrl report: {run.name}", body), umask=None)
    return out


def sweep_report(sweep_dir: Path) -> Path:
    """Each point's report, then the sweep's page: one column per point, one row per panel. Every
    file any of them writes is looked at first."""
    index = read_index(sweep_dir)
    dirs = [d for d in index.point_dirs(sweep_dir) if d.is_dir()]
    out = RunDir(sweep_dir).report_page()
    for path in [out, *(t for d in dirs for t in targets(RunDir(d)))]:
        check_target(path)
    for d in dirs:
        run_report(d)
    head = "".join(f"<th>{html.escape(p.name)}<br><small>{html.escape(str(p.values))}</small></th>"
                   for p in index.points)
    rows = []
    for key, title in TITLES.items():
        cells = []
        for d in index.point_dirs(sweep_dir):
            png = chart_path(RunDir(d).report_dir(), key)
            cells.append(f"<td>{_img(png, f'{d.name}: {title}') if png.is_file() else '<span class=none>-</span>'}</td>")
        rows.append(f'<tr id="panel-{key}"><th>{html.escape(title)}</th>{"".join(cells)}</tr>')
    write_text(out, page(f"slurmrl report: sweep {index.name}",
                         [f"<table><tr><th></th>{head}</tr>{''.join(rows)}</table>"]), umask=None)
    return out


def report(target: str) -> int:
    path = Path(target)
    if not path.is_dir():
        raise UserError(target, "is not a run dir (no such folder)")
    if is_sweep_dir(path):
        out = sweep_report(path)
    else:
        run = RunDir(path)
        if not run.plan.is_file() and not run.script.is_file():
            raise UserError(target, "is not a run dir (no job.sbatch or plan.json): give a run dir or a sweep dir")
        out = run_report(path)
    print(f"wrote {out} (open it in a browser; the PNGs are beside it)")
    return 0


def cmd_report(args) -> int:
    return report(args.run_dir)
