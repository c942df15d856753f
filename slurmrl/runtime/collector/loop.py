"""The [collector]'s loop: every ``--interval`` seconds, GET ``/metrics`` of every endpoint the job has
so far and append what changed to ``RUN_DIR/metrics/scrape/attempt-N/<target>.jsonl``
(``slurmrl.rundir.scrape``), until the size cap (``--max-mb``, every attempt's files together) or TERM.

    python -m slurmrl.runtime.collector [--interval S] [--max-mb N] [--ready COMPONENT]... [--target NAME=URL]...

Endpoints are found again at every scrape, so a server that becomes ready later is scraped from then:
``--ready COMPONENT``: each ready task's URL (its ready file) + ``/metrics``, as ``COMPONENT.TASK``;
``--target NAME=URL``: a fixed URL (vllm-router's metrics port); and every URL a program of ours
registered in ``RUN_DIR/metrics/endpoints/attempt-N/`` (the trainer, the orchestrator). Requests carry
the job's secret (``$SLURMRL_SECRET_FILE``). The node's GPUs are the target ``gpus.<host>`` where
``nvidia-smi`` exists. A scrape that fails is noted in the file (once per different error) and the
collector goes on; it is a non-critical component by default (``critical = false``).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

from slurmrl import secret
from slurmrl.contract.programs import CollectorArgs
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import read_text
from slurmrl.rundir.ready import read_ready
from slurmrl.rundir.scrape import Writer, parse_exposition
from slurmrl.runtime.collector import gpus
from slurmrl.runtime.vllm import client


def log(msg: str) -> None:
    print(f"slurmrl collector: {msg}", flush=True)


def _url_of(path: Path) -> str | None:
    try:
        text = read_text(path, missing="").strip()
    except Exception:  # being written, or not ours: found again at the next scrape
        return None
    return text if text.startswith(("http://", "https://")) and text.isprintable() and " " not in text else None


class Collector:
    def __init__(self, run_dir: RunDir, attempt: str, ready: list[str], targets: dict[str, str], max_bytes: int,
                 timeout: float, headers: dict[str, str] | None = None, gpu: bool | None = None):
        self.run_dir, self.attempt, self.ready, self.targets = run_dir, attempt, ready, targets
        self.max_bytes, self.timeout = max_bytes, timeout
        self.headers = secret.headers() if headers is None else headers
        self.gpu = gpus.available() if gpu is None else gpu
        self.writers: dict[str, Writer] = {}
        self.host = socket.gethostname().split(".")[0]
        root = run_dir.metrics_dir / RunDir.SCRAPE
        self.earlier = sum(f.stat().st_size for f in root.rglob("*.jsonl")) if root.is_dir() else 0
        self.full = False

    def endpoints(self) -> dict[str, str]:
        """target name -> URL, as the run dir says now."""
        out = dict(self.targets)
        for name in self.ready:
            for task, f in self.run_dir.ready_tasks(self.attempt, name).items():
                try:
                    url = read_ready(f).url
                except Exception:  # a ready file being written: found at the next scrape
                    continue
                if url and url.startswith("http"):
                    out[f"{name}.{task}"] = url.rstrip("/") + "/metrics"
        for f in self.run_dir.metrics_endpoints(self.attempt):
            url = _url_of(f)
            if url:
                out.setdefault(f.name, url)
        return out

    @property
    def used(self) -> int:
        return self.earlier + sum(w.written for w in self.writers.values())

    def writer(self, target: str, url: str, now: float) -> Writer:
        w = self.writers.get(target)
        if w is None:
            w = self.writers[target] = Writer(self.run_dir.scrape_file(self.attempt, target), url, now)
            log(f"scraping {target} at {url}")
        return w

    def tick(self, now: float | None = None) -> None:
        """One scrape of every endpoint (and the GPUs); at the cap, one last line per file."""
        if self.full:
            return
        now = time.time() if now is None else now
        for target, url in self.endpoints().items():
            answer = client.ask("GET", url, timeout=self.timeout, headers={**self.headers, "Accept": "text/plain"})
            if not answer.ok:
                said = " ".join(answer.said(100).split())
                why = (f"HTTP {answer.status}" + ("" if said.startswith("<") or not said else f": {said}")
                       if answer.status else str(answer.reason))
                self.writer(target, url, now).failed(now, why)
                continue
            self.writer(target, url, now).scrape(now, parse_exposition(answer.text))
        if self.gpu:
            found = gpus.sample(self.timeout)
            if found:
                self.writer(f"gpus.{self.host}", "nvidia-smi", now).scrape(now, found)
        if self.used >= self.max_bytes:
            for w in self.writers.values():
                w.full(now)
            self.full = True
            log(f"the scraped files reached {self.max_bytes >> 20} MB (collector.max_mb): no more scrapes")


def main(argv: list[str] | None = None) -> int:
    args = CollectorArgs.parse(argv, description=__doc__.splitlines()[0])
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run_dir = RunDir.from_env()
    c = Collector(run_dir, RunDir.attempt_from_env(), list(args.ready), args.target_urls, args.max_mb << 20,
                  timeout=min(5.0, max(1.0, args.interval)))
    log(f"every {args.interval:g}s into {run_dir.scrape_dir(c.attempt)}"
        f"{'' if c.gpu else ' (no nvidia-smi here: no GPU samples)'}; pid {os.getpid()}")
    while not stop.is_set():
        start = time.monotonic()
        c.tick()
        stop.wait(max(0.0, args.interval - (time.monotonic() - start)))
    log(f"stopped; {c.used >> 10} KiB in the scraped files")
    return 0
