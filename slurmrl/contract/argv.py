"""Command lines of the step wrappers, defined once: the planner writes each with ``to_argv`` and the
program reads it with ``parse`` (argparse inside, the program's help texts); ``MODULE`` is what
``python -m`` runs. The programs' own command lines (trainer, orchestrator, collector, benchmark)
are in ``slurmrl.contract.programs``.

A dataclass is generic in its words ``W``: the program parses ``str``; the planner may put a shell
expression it wrote (``slurmrl.plan.model.Sh``, ``${PORT_...}``) wherever the script expands a value,
and the rendered script's words, once the shell has expanded them, are what ``parse`` reads.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

from slurmrl.contract import restart_policy

W = TypeVar("W")


def split_command(ap: argparse.ArgumentParser, argv: Sequence[str], what: str) -> tuple[list[str], tuple[str, ...]]:
    """``argv`` cut at its first ``--``: the options, and the command after it (which must be there)."""
    argv = list(argv)
    if "--" not in argv:
        ap.parse_args(argv)  # --help, or a usage error
        ap.error(f"give {what} after --")
    cut = argv.index("--")
    command = tuple(argv[cut + 1:])
    if not command:
        ap.error(f"give {what} after --")
    return argv[:cut], command


def value_after(args: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in an argv (the last one wins, as in argparse; ``--flag=value`` too)."""
    found = None
    for k, a in enumerate(args):
        if a == flag and k + 1 < len(args):
            found = args[k + 1]
        elif a.startswith(flag + "="):
            found = a.split("=", 1)[1]
    return found


def flag(name: str, value: object) -> list:
    """``[name, value]``, nothing for None; a value that is not a word (an int) as its text."""
    if value is None:
        return []
    return [name, value if not isinstance(value, int) else str(value)]


@dataclass(frozen=True)
class Supervise(Generic[W]):
    """``python -m slurmrl.runtime.steps.supervise NAME [options] -- COMMAND``: readiness, ready file,
    signals, heartbeat, failure probes.

    ``ready``: the URL it checks (or ``started``); ``ready_completion``: the served model it asks
    for one completion once the URL answers (ready means serving); ``ready_model`` and
    ``ready_instances``: Dynamo's frontend lists the model with that many workers; ``ready_workers``:
    vllm-router has every worker registered."""

    MODULE: ClassVar[str] = "slurmrl.runtime.steps.supervise"
    USAGE: ClassVar[str] = "%(prog)s NAME [--gpus FIRST:COUNT] [--ready URL] -- COMMAND..."

    name: str
    gpus: W | None = None  # FIRST:COUNT GPU positions of the task
    ready: W | None = None
    heartbeat: int = 0
    cuda_runtime: bool = False
    ready_model: str | None = None
    ready_instances: int | None = None
    ready_workers: W | int | None = None
    ready_completion: str | None = None
    fail_on: tuple[str, ...] = ()  # the recipe's failure probes for this component (regexes)
    restart: str | None = None  # a serving component's restart policy (slurmrl.contract.restart_policy); None: not a server
    max_restarts: int | None = None
    restart_backoff: int | None = None
    worker_tasks: int | None = None  # a server spanning nodes: its tasks (consecutive ids) restart as one worker
    command: tuple[W, ...] = ()  # the planner appends the command itself (``to_argv`` ends with ``--``)

    def to_argv(self) -> list[W | str]:
        argv: list = [self.name, *flag("--gpus", self.gpus), *flag("--ready", self.ready)]
        argv += flag("--heartbeat", self.heartbeat or None)
        argv += ["--cuda-runtime"] if self.cuda_runtime else []
        argv += flag("--ready-model", self.ready_model) + flag("--ready-instances", self.ready_instances)
        argv += flag("--ready-workers", self.ready_workers) + flag("--ready-completion", self.ready_completion)
        argv += [w for p in self.fail_on for w in ("--fail-on", p)]
        argv += flag("--restart", self.restart) + flag("--max-restarts", self.max_restarts)
        argv += flag("--restart-backoff", self.restart_backoff) + flag("--worker-tasks", self.worker_tasks)
        return [*argv, "--", *self.command]

    @classmethod
    def parser(cls, description: str = "") -> argparse.ArgumentParser:
        ap = argparse.ArgumentParser(prog=f"python -m {cls.MODULE}", usage=cls.USAGE, description=description)
        ap.add_argument("name", help="the component (names the ready file and the log lines)")
        ap.add_argument("--gpus", metavar="FIRST:COUNT", help="GPU positions of this task among the step's GPUs")
        ap.add_argument("--ready", metavar="URL", help="http://HOST:PORT, tcp://HOST:PORT or started")
        ap.add_argument("--ready-model", metavar="NAME",
                        help="with an http --ready URL: ready once GET /v1/models lists NAME (not /health)")
        ap.add_argument("--ready-instances", type=int, metavar="N",
                        help="with --ready-model: and once /health lists N workers (generate endpoints) of $DYN_NAMESPACE")
        ap.add_argument("--ready-completion", metavar="MODEL",
                        help="with an http --ready URL: and once a completion of MODEL through it returns a token")
        ap.add_argument("--ready-workers", type=int, metavar="N",
                        help="with --ready-completion: and once the router there lists N workers (GET /list_workers)")
        ap.add_argument("--heartbeat", type=int, default=0, metavar="SECONDS",
                        help="end the command (exit 124) when it has not called slurmrl.heartbeat.beat() for SECONDS")
        ap.add_argument("--fail-on", action="append", default=[], metavar="REGEX",
                        help="a failure probe: a log line matching REGEX ends the task (and the job) with the line as "
                        "the cause")
        ap.add_argument("--cuda-runtime", action="store_true",
                        help="put the CUDA runtime of the nvidia-cuda-runtime wheel (when installed) on LD_LIBRARY_PATH")
        ap.add_argument("--restart", choices=restart_policy.MODES,
                        help="a server: relaunch the command in place when it ends (on-failure: when it failed), "
                        "and record each death and restart in RUN_DIR/events.jsonl")
        ap.add_argument("--max-restarts", type=int, metavar="N",
                        help=f"with --restart: at most N relaunches, then the task ends, recorded as dead "
                        f"(default {restart_policy.DEFAULT_MAX_RESTARTS})")
        ap.add_argument("--restart-backoff", type=int, metavar="SECONDS",
                        help=f"with --restart: wait SECONDS before the first relaunch (default "
                        f"{restart_policy.DEFAULT_BACKOFF_S}), doubling for each one after (at most {restart_policy.BACKOFF_CAP_S}s)")
        ap.add_argument("--worker-tasks", type=int, metavar="N",
                        help="with --restart: this task is one of N consecutive tasks of one server spanning nodes; "
                        "they restart as a whole (every task's command ended, then all relaunched)")
        return ap

    @classmethod
    def parse(cls, argv: Sequence[str], description: str = "") -> Supervise[str]:
        ap = cls.parser(description)
        options, command = split_command(ap, argv, "the command")
        a = ap.parse_args(options)
        return Supervise(a.name, a.gpus, a.ready, a.heartbeat, a.cuda_runtime, a.ready_model, a.ready_instances,
                         a.ready_workers, a.ready_completion, tuple(a.fail_on), a.restart, a.max_restarts,
                         a.restart_backoff, a.worker_tasks, command)

    def restart_policy(self) -> restart_policy.Policy | None:
        """The parsed policy (None: not a server, no events); parsed words only (``Supervise[str]``)."""
        if self.restart is None:
            return None
        return restart_policy.Policy(
            self.restart,
            restart_policy.DEFAULT_MAX_RESTARTS if self.max_restarts is None else int(self.max_restarts),
            restart_policy.DEFAULT_BACKOFF_S if self.restart_backoff is None else int(self.restart_backoff),
        )


@dataclass(frozen=True)
class Guard:
    """``python -m slurmrl.runtime.steps.guard [--ended FILE] [--serves] [--fail-on REGEX]... -- COMMAND``:
    written by the supervisor (the guard runs the command and writes its end record)."""

    MODULE: ClassVar[str] = "slurmrl.runtime.steps.guard"

    command: tuple[str, ...]
    ended: str | None = None
    serves: bool = False
    fail_on: tuple[str, ...] = ()

    def to_argv(self) -> list[str]:
        argv = [*flag("--ended", self.ended), *(["--serves"] if self.serves else [])]
        return [*argv, *(w for p in self.fail_on for w in ("--fail-on", p)), "--", *self.command]

    @classmethod
    def parse(cls, argv: Sequence[str]) -> Guard | None:
        """None when ``argv`` is not a guard's command line (the guard then runs nothing)."""
        argv = list(argv)
        if "--" not in argv or argv.index("--") == len(argv) - 1:
            return None
        cut = argv.index("--")
        ap = argparse.ArgumentParser(prog=f"python -m {cls.MODULE}", add_help=False)
        ap.add_argument("--ended", metavar="FILE")
        ap.add_argument("--serves", action="store_true")
        ap.add_argument("--fail-on", action="append", default=[], metavar="REGEX")
        a, unknown = ap.parse_known_args(argv[:cut])
        if unknown:
            return None
        return Guard(tuple(argv[cut + 1:]), a.ended, a.serves, tuple(a.fail_on))


# vLLM's ``--middleware`` on every server that needs the job's secret (every path but /health and /metrics):
# the planner writes it, ``slurmrl.runtime.gates.job_auth`` is it, `slurmrl status` finds it in job.sbatch
AUTH_MIDDLEWARE = "slurmrl.runtime.gates.job_auth.RequireJobSecret"


@dataclass(frozen=True)
class AuthGate(Generic[W]):
    """``python -m slurmrl.runtime.gates.auth_gate --listen HOST:PORT --upstream PORT -- ROUTER...``."""

    MODULE: ClassVar[str] = "slurmrl.runtime.gates.auth_gate"

    listen: W
    upstream: W | int
    command: tuple[W, ...] = ()  # the planner appends the router's command (``to_argv`` ends with ``--``)

    def to_argv(self) -> list[W | str]:
        return ["--listen", self.listen, *flag("--upstream", self.upstream), "--", *self.command]

    @classmethod
    def parse(cls, argv: Sequence[str], description: str = "") -> AuthGate[str]:
        ap = argparse.ArgumentParser(prog=f"python -m {cls.MODULE}", description=description)
        ap.add_argument("--listen", required=True, metavar="HOST:PORT", help="where clients reach the router")
        ap.add_argument("--upstream", required=True, type=int, metavar="PORT", help="the router's port on 127.0.0.1")
        ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the router's command line")
        a = ap.parse_args(list(argv))
        command = a.command[1:] if a.command[:1] == ["--"] else a.command
        if not command:
            ap.error("give the router's command after --")
        return AuthGate(a.listen, a.upstream, tuple(command))


@dataclass(frozen=True)
class Stage(Generic[W]):
    """``python -m slurmrl.runtime.steps.stage SRC STAGE_DIR KEY``: copy the model to node-local disk."""

    MODULE: ClassVar[str] = "slurmrl.runtime.steps.stage"

    src: W
    stage_dir: W
    key: W

    def to_argv(self) -> list[W]:
        return [self.src, self.stage_dir, self.key]

    @classmethod
    def parse(cls, argv: Sequence[str], description: str = "") -> Stage[str]:
        ap = argparse.ArgumentParser(prog=f"python -m {cls.MODULE}", description=description)
        ap.add_argument("src", help="model.path: the folder to copy")
        ap.add_argument("stage_dir", help="model.stage_dir: the node-local folder the copy goes under")
        ap.add_argument("key", help="the copy's key (the source's identity): a new key is a new copy")
        a = ap.parse_args(list(argv))
        return Stage(a.src, a.stage_dir, a.key)
