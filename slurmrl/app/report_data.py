"""What `slurmrl report` draws, computed from a run dir's files: the [collector]'s scrapes (vLLM's
counters as rates, its histograms as means per scrape window and quantiles over the run, queue and KV
gauges, the GPUs), the trainer's and orchestrator's step records (the RL step's time split,
reward, KL, weight sync), the evaluations (metrics/eval.jsonl) and the phases of every attempt.
Times are seconds since the run's first phase (or first scrape).

A latency point is a window's mean: at the scrape that closes a window, Δsum / Δcount of vLLM's
histogram, the mean over the requests that finished (TTFT: whose first token came) within it. A
window where none did is a gap (NaN), not a line drawn across the idle minutes between RL batches."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from slurmrl.app.job_outputs import read_evaluations, read_typed
from slurmrl.contract import events
from slurmrl.contract.metrics import OrchestratorRow, TrainerRow
from slurmrl.rundir.evals import Evaluation
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.scrape import Scrapes, read_scrapes, split_key

Points = list[tuple[float, float]]
R = TypeVar("R")
# vLLM's names, newest first where a release renamed one
GENERATION = ("vllm:generation_tokens_total",)
PROMPT = ("vllm:prompt_tokens_total",)
TTFT = ("vllm:time_to_first_token_seconds",)
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
QUANTILES = (0.5, 0.9, 0.99)
# the RL step's time split: (record field, what it is), per program
ORCHESTRATOR_SPLIT: tuple[tuple[Callable[[OrchestratorRow], Any], str], ...] = (
    (lambda r: r.generate_s, "generate"), (lambda r: r.score_s, "score"), (lambda r: r.reload_s, "load new weights"),
    (lambda r: r.wait_s, "wait for the trainer"), (lambda r: r.sleep_s, "sleep (hybrid)"))
TRAINER_SPLIT: tuple[tuple[Callable[[TrainerRow], Any], str], ...] = (
    (lambda r: r.step_time_s, "train"), (lambda r: r.publish_s, "publish weights"),
    (lambda r: r.wait_s, "wait for rollouts"))


def summed(s: Scrapes, names: tuple[str, ...], suffix: str = "") -> Points:
    """The metric's value summed over its labels at each scrape (the first of ``names`` it has)."""
    for name in names:
        keys = [k for k in s.keys(name + suffix) if split_key(k)[0] == name + suffix]
        if keys:
            out = []
            for i, t in enumerate(s.times):
                vals = [v for k in keys if (v := s.values[k][i]) is not None and math.isfinite(v)]
                if vals:
                    out.append((t, float(sum(vals))))
            return out
    return []


def rate(points: Points) -> Points:
    """Per second between two scrapes, at the second one (a counter that went down restarted: skipped)."""
    return [(t1, (v1 - v0) / (t1 - t0)) for (t0, v0), (t1, v1) in zip(points, points[1:]) if t1 > t0 and v1 >= v0]


def hist_mean(s: Scrapes, names: tuple[str, ...]) -> Points:
    """A histogram's mean per window between two scrapes (Δsum / Δcount), at the window's end: the mean
    of the requests it observed in that window; NaN (a gap) for a window that observed none."""
    for name in names:
        sums, counts = dict(summed(s, (name,), "_sum")), dict(summed(s, (name,), "_count"))
        times = sorted(set(sums) & set(counts))
        if times:
            out = []
            for t0, t1 in zip(times, times[1:]):
                dc, ds = counts[t1] - counts[t0], sums[t1] - sums[t0]
                if dc > 0 and ds >= 0:
                    out.append((t1, ds / dc))
                elif dc == 0:
                    out.append((t1, math.nan))
            return out
    return []


def hist_quantiles(s: Scrapes, names: tuple[str, ...]) -> dict[float, float] | None:
    """Quantiles over the server's life from its last scrape's buckets (as Prometheus' histogram_quantile)."""
    for name in names:
        buckets: dict[float, float] = {}
        for key in s.keys(name + "_bucket"):
            base, labels = split_key(key)
            pts = s.series(key)
            if base != name + "_bucket" or "le" not in labels or not pts:
                continue
            le = float(labels["le"])
            buckets[le] = buckets.get(le, 0.0) + pts[-1][1]  # cumulative since the server started
        if not buckets or buckets.get(math.inf, 0.0) <= 0:
            continue
        bounds = sorted(buckets)
        total = buckets[math.inf]
        out = {}
        for q in QUANTILES:
            rank, prev_le, prev_c = q * total, 0.0, 0.0
            for le in bounds:
                c = buckets[le]
                if c >= rank:
                    if math.isinf(le):
                        out[q] = prev_le
                    else:
                        out[q] = prev_le + (le - prev_le) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 1.0)
                    break
                prev_le, prev_c = le, c
        return out
    return None


@dataclass
class RunData:
    """One run dir's numbers, ready to draw."""

    run: RunDir
    t0: float | None = None
    phases: list[tuple[int, list[tuple[float, str]]]] = field(default_factory=list)  # attempt -> (t, what)
    servers: dict[str, Scrapes] = field(default_factory=dict)  # "attempt-N/inference.0" -> its scrapes
    gpus: dict[str, Scrapes] = field(default_factory=dict)
    others: dict[str, Scrapes] = field(default_factory=dict)  # router, frontend, trainer, orchestrator
    orchestrator: dict[int, OrchestratorRow] = field(default_factory=dict)
    trainer: dict[int, TrainerRow] = field(default_factory=dict)
    evals: list[Evaluation] = field(default_factory=list)  # metrics/eval.jsonl
    events: list[events.Event] = field(default_factory=list)  # events.jsonl: deaths, restarts, joins

    def through(self) -> str | None:
        """A result produced through restarts or dead servers says so: one sentence, None when there were none."""
        count = {k: sum(1 for e in self.events if e.kind == k) for k in ("restarted", "dead")}
        if not any(count.values()):
            return None
        return (f"Produced through {count['restarted']} restart(s) in place and {count['dead']} task(s) that died "
                "for good (events.jsonl, lock.toml's [[lock.restarts]]; in the phases below).")

    def x(self, t: float) -> float:
        return t - (self.t0 or 0.0)


def read_run(run: RunDir) -> RunData:
    d = RunData(run)
    d.events = events.read(run.events)
    for a in run.attempts():
        found = [(float(t), what) for t, what in run.read_phases(a)]
        found = sorted(found + [(e.time, event_phase(e)) for e in d.events if e.attempt == a])
        if found:
            d.phases.append((a, found))
    for a in run.scrape_attempts():
        for f in run.scrape_files(a):
            s = read_scrapes(f)
            label = f"attempt-{a}/{s.target}"
            if s.target.startswith("gpus."):
                d.gpus[label] = s
            elif any(k.startswith("vllm:") for k in s.values):
                d.servers[label] = s
            else:
                d.others[label] = s
    d.orchestrator = read_typed(OrchestratorRow.from_json, run.metrics("orchestrator"))
    d.trainer = read_typed(TrainerRow.from_json, run.metrics("trainer"))
    d.evals = read_evaluations(run.path)
    starts = [p[0][0] for _, p in d.phases] + [s.times[0] for s in (*d.servers.values(), *d.gpus.values(),
                                                                      *d.others.values()) if s.times]
    d.t0 = min(starts) if starts else None
    return d


def event_phase(e: events.Event) -> str:
    """An event as a phase of its attempt: ``restarted inference.1 on n2: exited with code 137 (SIGKILL)``."""
    who = e.component + (f".{e.task}" if e.task is not None else "")
    return f"{e.kind} {who}{' on ' + e.node if e.node else ''}{': ' + e.cause if e.cause else ''}"


def step_field(records: dict[int, R], get: Callable[[R], Any]) -> tuple[list[float], list[float]]:
    """(steps, values) of the records' finite numbers in the field ``get`` reads."""
    xs, ys = [], []
    for step in sorted(records):
        v = get(records[step])
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(float(step))
            ys.append(float(v))
    return xs, ys


def eval_series(evals: list[Evaluation]) -> tuple[list[tuple[str, list[float], list[float]]], list[tuple[str, list[float], list[float]]]]:
    """The evaluations as (reward series, pass@k series): "eval reward (mean)" and one "eval pass@K" per k."""
    reward = [e for e in evals if e.reward_mean is not None]
    ks = sorted({k for e in evals for k in e.pass_at})
    rewards = [("eval reward (mean)", [float(e.step) for e in reward], [float(e.reward_mean or 0.0) for e in reward])]
    passes = [(f"eval pass@{k}", [float(e.step) for e in evals if k in e.pass_at],
               [e.pass_at[k] for e in evals if k in e.pass_at]) for k in ks]
    return [r for r in rewards if r[1]], passes
