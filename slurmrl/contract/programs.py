"""Command lines of slurmrl's programs, defined once (see ``slurmrl.contract.argv`` for the step
wrappers and for ``W``, the word type): the planner writes each with ``to_argv``, the program reads
it with ``parse``, the help texts are the program's."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Generic

from slurmrl.contract.argv import W, flag, split_command, value_after
from slurmrl.contract.bench_summary import GRID, SESSIONS, TRACE


@dataclass(frozen=True)
class WeightServers(Generic[W]):
    """One server component for a broadcast: each server's worker processes, and every server's URL."""

    ranks: int
    urls: tuple[W, ...]  # the planner's: one shell array that expands to the URLs


@dataclass(frozen=True)
class TrainerArgs(Generic[W]):
    """``python -m slurmrl.runtime.trainer --config TOML [--weight-servers RANKS URL...]...
    [--weight-master HOST:PORT --weight-world-size N]`` (under torchrun); the ``--weight-*`` with
    ``trainer.weight_sync`` by broadcast only."""

    MODULE: ClassVar[str] = "slurmrl.runtime.trainer"
    DESCRIPTION: ClassVar[str] = "slurmrl trainer (SFT or RL), one process per GPU under torchrun"

    config: W
    weight_servers: tuple[WeightServers[W], ...] = ()
    weight_master: W | None = None
    weight_world_size: int | None = None

    def to_argv(self) -> list[W | str]:
        argv: list = ["--config", self.config]
        for group in self.weight_servers:
            argv += ["--weight-servers", str(group.ranks), *group.urls]
        return argv + flag("--weight-master", self.weight_master) + flag("--weight-world-size", self.weight_world_size)

    @classmethod
    def parser(cls) -> argparse.ArgumentParser:
        ap = argparse.ArgumentParser(prog=f"python -m {cls.MODULE}", description=cls.DESCRIPTION)
        ap.add_argument("--config", required=True, help="RUN_DIR/components/trainer.toml")
        ap.add_argument("--weight-servers", nargs="+", action="append", default=[], metavar="RANKS URL",
                        help="trainer.weight_sync by broadcast, per server component: each server's worker "
                        "processes, then every server's URL (once per component)")
        ap.add_argument("--weight-master", metavar="HOST:PORT", help="where rank 0 hosts the transfer group")
        ap.add_argument("--weight-world-size", type=int, help="the transfer group's size: 1 + every server's workers")
        return ap

    @classmethod
    def parse(cls, argv: Sequence[str]) -> TrainerArgs[str]:
        ap = cls.parser()
        a = ap.parse_args(list(argv))
        groups = []
        for group in a.weight_servers:
            if not group[0].isdigit() or len(group) < 2:
                ap.error(f"--weight-servers {' '.join(group)}: give the workers per server, then the servers' URLs")
            groups.append(WeightServers(int(group[0]), tuple(group[1:])))
        if a.weight_master is not None:
            host, _, port = a.weight_master.rpartition(":")
            if not host or not port.isdigit():
                ap.error(f"--weight-master {a.weight_master}: HOST:PORT")
        return TrainerArgs(a.config, tuple(groups), a.weight_master, a.weight_world_size)

    @property
    def master(self) -> tuple[str, int]:
        """``--weight-master`` as (host, port); ``parse`` checked its form."""
        host, _, port = str(self.weight_master).rpartition(":")
        return host, int(port)


@dataclass(frozen=True)
class OrchestratorArgs(Generic[W]):
    """``python -m slurmrl.runtime.orchestrator --config TOML --requests-url URL... --admin-urls URL...
    [--judge-urls URL...]``."""

    MODULE: ClassVar[str] = "slurmrl.runtime.orchestrator"

    config: W
    requests_url: tuple[W, ...]
    admin_urls: tuple[W, ...]
    judge_urls: tuple[W, ...] = ()

    def to_argv(self) -> list[W | str]:
        argv: list = ["--config", self.config, "--requests-url", *self.requests_url, "--admin-urls", *self.admin_urls]
        return argv + (["--judge-urls", *self.judge_urls] if self.judge_urls else [])

    @classmethod
    def parse(cls, argv: Sequence[str] | None = None, description: str = "") -> OrchestratorArgs[str]:
        """``argv`` (default: this process's); URLs without a trailing slash."""
        ap = argparse.ArgumentParser(prog=f"python -m {cls.MODULE}", description=description)
        ap.add_argument("--config", required=True, help="RUN_DIR/components/orchestrator.toml")
        ap.add_argument("--requests-url", dest="requests_url", nargs="+", required=True,
                        metavar="URL", help="where to ask for completions: the router, else every server")
        ap.add_argument("--admin-urls", nargs="+", required=True, metavar="URL",
                        help="every inference server (each reloads new weights)")
        ap.add_argument("--judge-urls", nargs="+", default=[], metavar="URL",
                        help="every judge server, when the job has a [judge] (rewards are scored through it)")
        a = ap.parse_args(None if argv is None else list(argv))
        return OrchestratorArgs(a.config, tuple(u.rstrip("/") for u in a.requests_url),
                            tuple(u.rstrip("/") for u in a.admin_urls), tuple(a.judge_urls))


def _target(word: str) -> tuple[str, str]:
    name, sep, url = word.partition("=")
    if not sep or not name or "/" in name or not url.startswith("http"):
        raise argparse.ArgumentTypeError(f"give NAME=http://HOST:PORT/metrics, not {word!r}")
    return name, url


@dataclass(frozen=True)
class CollectorArgs(Generic[W]):
    """``python -m slurmrl.runtime.collector [--interval S] [--max-mb MB] [--ready COMPONENT]...
    [--target NAME=URL]...``."""

    MODULE: ClassVar[str] = "slurmrl.runtime.collector"

    interval: float = 10.0
    max_mb: int = 512
    ready: tuple[str, ...] = ()
    targets: tuple[W, ...] = ()  # NAME=URL each (the planner's: the router's host and port expand in the script)

    def to_argv(self) -> list[W | str]:
        argv: list = ["--interval", str(self.interval), "--max-mb", str(self.max_mb)]
        argv += [w for c in self.ready for w in ("--ready", c)]
        return argv + [w for t in self.targets for w in ("--target", t)]

    @classmethod
    def parse(cls, argv: Sequence[str] | None = None, description: str = "") -> CollectorArgs[str]:
        ap = argparse.ArgumentParser(prog=f"python -m {cls.MODULE}", description=description)
        ap.add_argument("--interval", type=float, default=10.0, help="seconds between two scrapes")
        ap.add_argument("--max-mb", type=int, default=512, help="megabytes the scraped files may take in all")
        ap.add_argument("--ready", action="append", default=[], metavar="COMPONENT",
                        help="scrape URL/metrics of each ready task of COMPONENT")
        ap.add_argument("--target", action="append", default=[], type=_target, metavar="NAME=URL",
                        help="scrape this URL as NAME")
        a = ap.parse_args(None if argv is None else list(argv))
        return CollectorArgs(a.interval, a.max_mb, tuple(a.ready), tuple(f"{n}={u}" for n, u in a.target))

    @property
    def target_urls(self) -> dict[str, str]:
        """``--target`` as {NAME: URL}; ``parse`` checked each."""
        return dict(str(t).split("=", 1) for t in self.targets)  # type: ignore[misc]


@dataclass(frozen=True)
class BenchArgs(Generic[W]):
    """``python -m slurmrl.runtime.bench --out DIR --concurrencies N... --input-lens N... --output-lens N...
    [--timeout S] [--then stop|serve] -- VLLM_BENCH_SERVE_ARGS...``: the grid. A trace replay
    (``--dataset-name timed_trace`` among vLLM's arguments) has no lengths (the trace's) and its
    concurrency caps are optional (none: one point without a cap). With ``--aiperf PYTHON`` (the
    Python of aiperf's own venv) the arguments after ``--`` are ``aiperf profile``'s instead: a
    multi-turn session replay (``--input-file TRACE --custom-dataset-type multi_turn``), no lengths."""

    MODULE: ClassVar[str] = "slurmrl.runtime.bench"
    TRACE: ClassVar[str] = "timed_trace"  # vllm bench serve's dataset that replays a trace

    out: W
    concurrencies: tuple[int, ...] | None
    input_lens: tuple[int, ...] | None
    output_lens: tuple[int, ...] | None
    timeout: int = 3600
    then: str = "stop"
    vllm_args: tuple[W, ...] = ()  # vllm bench serve's own arguments (aiperf profile's with aiperf), after --
    aiperf: W | None = None  # the Python of aiperf's venv: a multi-turn replay through `aiperf profile`

    def to_argv(self) -> list[W | str]:
        argv: list = ["--out", self.out]
        for name, values in (("--concurrencies", self.concurrencies), ("--input-lens", self.input_lens),
                             ("--output-lens", self.output_lens)):
            argv += [name, *map(str, values)] if values is not None else []
        argv += ["--aiperf", self.aiperf] if self.aiperf is not None else []
        return [*argv, "--timeout", str(self.timeout), "--then", self.then, "--", *self.vllm_args]

    @classmethod
    def parse(cls, argv: Sequence[str], description: str = "") -> BenchArgs[str]:
        ap = argparse.ArgumentParser(prog=f"python -m {cls.MODULE}", description=description)
        ap.add_argument("--out", required=True, help="results folder (RUN_DIR/benchmark)")
        ap.add_argument("--concurrencies", type=int, nargs="+", help="one point per cap (a trace without: one point)")
        ap.add_argument("--input-lens", type=int, nargs="+", help="the grid's prompt lengths (a trace: none)")
        ap.add_argument("--output-lens", type=int, nargs="+", help="the grid's output lengths (a trace: none)")
        ap.add_argument("--timeout", type=int, default=3600, help="seconds the whole grid may take")
        ap.add_argument("--then", choices=("stop", "serve"), default="stop")
        ap.add_argument("--aiperf", help="the Python of aiperf's venv: the arguments after -- are aiperf profile's "
                        "(a multi-turn session replay)")
        options, vllm_args = split_command(ap, argv, "vllm bench serve's (or aiperf profile's) arguments")
        a = ap.parse_args(options)
        if a.aiperf is not None and value_after(vllm_args, "--input-file") is None:
            ap.error("an aiperf replay needs --input-file TRACE among aiperf profile's arguments")
        trace = mode_of(a.aiperf, vllm_args) != GRID
        if trace and (a.input_lens or a.output_lens):
            ap.error(f"a trace replay (--dataset-name {cls.TRACE} or --aiperf) takes its lengths from the trace: "
                     "no --input-lens/--output-lens")
        if not trace and not (a.concurrencies and a.input_lens and a.output_lens):
            ap.error("the grid needs --concurrencies, --input-lens and --output-lens")

        def opt(values: list[int] | None) -> tuple[int, ...] | None:
            return tuple(values) if values is not None else None

        return BenchArgs(a.out, opt(a.concurrencies), opt(a.input_lens), opt(a.output_lens), a.timeout, a.then,
                     vllm_args, a.aiperf)

    @property
    def mode(self) -> str:
        """What the benchmark measures (``slurmrl.contract.bench_summary``: grid, trace, sessions), decided
        here once from the command line; the runner writes it into the summary every reader asks."""
        return mode_of(self.aiperf, self.vllm_args)

    @property
    def trace(self) -> str | None:
        """The trace a replay reads (``--dataset-path`` with ``--dataset-name timed_trace``, aiperf's
        ``--input-file``); None for the grid."""
        words = [str(w) for w in self.vllm_args]
        mode = self.mode
        return value_after(words, "--input-file") if mode == SESSIONS else (
            value_after(words, "--dataset-path") if mode == TRACE else None)


def mode_of(aiperf: object, tool_args: Sequence[object]) -> str:
    """A benchmark's mode from its command line: ``--aiperf`` replays sessions, vLLM's ``--dataset-name
    timed_trace`` a trace; anything else is the grid."""
    if aiperf is not None:
        return SESSIONS
    return TRACE if value_after([str(w) for w in tool_args], "--dataset-name") == BenchArgs.TRACE else GRID
