"""Failure probes: what a task's log says about why it failed, read as the guard passes the output on.

Built-in probes, in the order a cause is chosen:
- **fatal** (the task is ended at once, the job with it; the cause goes to FAILED and `status`):
  CUDA out of memory, an NCCL error, a model path that does not exist, vLLM's engine process died
  (its API server may then exit 0), and every pattern of the component's ``fail_on`` list in the
  recipe. Once a stop was asked (the guard passed a TERM on) they end nothing: what a command says
  as it stops is not a failure;
- **a Python traceback**: its exception line and the innermost frame of ours to blame, as
  "ZeroDivisionError in env.py:36: division by zero". A traceback alone ends nothing (a server logs
  one for a bad request and serves on); it is the cause when the task then exits (non-zero, or a
  server at all). The first traceback wins (torchrun's ChildFailedError, which only wraps a worker's,
  and planned-stop SignalExceptions are not causes). A traceback that did not end the process never
  counts: one a thread printed as it died (``Exception in thread ...``), one http.server printed for a
  request (``Exception occurred during processing of request from ...``: a scraper that went away), a
  logging error, an asyncio task nobody awaited;
- **how a worker ended**: torchrun's record of its first failed worker ("Root Cause (first observed
  failure)": rank, ``exitcode : -9 (pid: 4242) (SIGKILL)``): a worker a signal ended is named by the
  signal, whatever its log said before;
- **notes** (a probe with ``fatal=False``): the cause when nothing better was said: the one line
  our own programs end with in place of a traceback ("cannot load environment ...").

Lines may carry the prefixes torchrun (``[rank0]:``) and vLLM (``(EngineCore_DP0 pid=12)``) put in
front of a process's output. Standard library only (it runs in the step's guard)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MAX_LINE = 4096  # characters of a line the probes read (a progress bar without newlines is cut here)
MAX_TEXT = 200  # characters of a log line quoted in a cause


@dataclass(frozen=True)
class Probe:
    what: str  # how the cause starts: "CUDA out of memory"
    pattern: re.Pattern[str]
    fatal: bool = True
    needles: tuple[str, ...] = ()  # the regex runs only on a line holding one of these (none: every line)

    def search(self, line: str) -> re.Match[str] | None:
        if self.needles and not any(n in line for n in self.needles):
            return None
        return self.pattern.search(line)


BUILTIN = (
    Probe("CUDA out of memory", re.compile(r"CUDA out of memory|CUDA error: out of memory|\bOutOfMemoryError\b"),
          needles=("out of memory", "OutOfMemoryError")),
    Probe("NCCL error", re.compile(
        r"\bNCCL error\b|\bnccl(?:InternalError|SystemError|UnhandledCudaError|InvalidUsage|InvalidArgument|RemoteError)\b"
        r"|Watchdog caught collective operation timeout|\bDistBackendError\b"),
          needles=("NCCL", "nccl", "Watchdog caught", "DistBackendError")),
    Probe("model not found", re.compile(
        r"""(\S{1,512}) is not a local folder and is not a valid model identifier"""
        r"""|Repo id must be in the form 'repo_name' or 'namespace/repo_name': '([^']*)'"""
        r"""|Invalid repository ID or local directory specified: '([^']*)'"""
        r"""|RepositoryNotFoundError|Repository Not Found for url"""
        r"""|(\S{1,512}) does not appear to have a file named config\.json"""),
          needles=("is not a local folder", "Repo id must be", "Invalid repository ID", "RepositoryNotFoundError",
                   "Repository Not Found", "does not appear to have a file named config.json")),
    Probe("vLLM's engine process died", re.compile(
        r"Engine core proc \S+ died unexpectedly|EngineCore encountered a fatal error|\bEngineDeadError\b"),
          needles=("Engine core proc", "EngineCore encountered", "EngineDeadError")),
    # the one line our programs end with instead of a traceback (an environment that does not load,
    # a server that failed the orchestrator, too few servers live): the cause when no traceback says more
    Probe("", re.compile(r"^slurmrl: (?:orchestrator: )?((?:cannot load )?environment .+|(?:sampling|weight update|scoring)"
                         r" failed.*|fewer than inference\.min_servers .+)$"), fatal=False, needles=("slurmrl: ",)),
)

PREFIX = re.compile(r"^(?:\[(?:rank|default)?\d+\]: ?|\(\w+(?: pid=\d+)?\) )")
HEADER = "Traceback (most recent call last):"
CHAINED = ("During handling of the above exception, another exception occurred:",
           "The above exception was the direct cause of the following exception:")
FRAME = re.compile(r'^\s+File "(.+)", line (\d+)(?:, in .*)?$')
EXCEPTION = re.compile(r"^((?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*))(?::\s?(.*))?$")
# the line before a traceback that a process printed and lived on (a thread, a request handler, logging, asyncio)
NOT_THE_END = re.compile(r"^(?:Exception in thread |Exception occurred during processing of request from |--- Logging error ---$"
                         r"|Task exception was never retrieved$|future: <Task |Exception in callback |handle: <|Exception ignored in)")
ROOT_CAUSE = "Root Cause (first observed failure):"
ROOT_RANK = re.compile(r"^rank\s*:\s*(\d+)")
ROOT_EXIT = re.compile(r"^exitcode\s*:\s*(-?\d+) \(pid: (\d+)\)")
WRAPPERS = frozenset({"SignalException", "ChildFailedError", "EngineDeadError"})  # say another failure happened
LIBRARIES = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")  # frames that are not the user's


def user_probes(patterns: Iterable[str]) -> tuple[Probe, ...]:
    """The recipe's ``fail_on`` patterns as fatal probes (checked by the recipe; a bad one here is a usage error)."""
    return tuple(Probe(f"log matched fail_on {p!r}", re.compile(p)) for p in patterns)


def where(frames: list[tuple[str, int]]) -> str:
    """The frame to blame: the innermost outside installed libraries (the user's code), else the innermost."""
    if not frames:
        return ""
    ours = [f for f in frames if not any(lib in f[0] for lib in LIBRARIES)]
    path, line = (ours or frames)[-1]
    return f"{path.rsplit('/', 1)[-1]}:{line}"


class Probes:
    """What every stream of one command said: the first fatal cause, the first traceback, the first note.
    ``stream()`` gives one line reader per output stream; ``on_fatal`` is called once, at the first
    fatal match (from the thread that read it)."""

    def __init__(self, extra: Iterable[Probe] = (), on_fatal: Callable[[str], None] | None = None) -> None:
        self.probes = (*BUILTIN, *extra)
        self.on_fatal = on_fatal
        self.lock = threading.Lock()
        self.fatal: str | None = None
        self.exception: str | None = None
        self.note: str | None = None
        self.worker: Worker | None = None  # torchrun's first failed worker

    @property
    def cause(self) -> str | None:
        return self.fatal or self.exception or self.note
    def stream(self) -> ProbeStream:
        return ProbeStream(self)

    def found(self, probe: Probe, m: re.Match[str], line: str, frames: list[tuple[str, int]]) -> None:
        detail = next((g for g in m.groups() if g), "") if probe.pattern.groups else ""
        at = where(frames)
        cause = ": ".join(filter(None, (probe.what, detail))) + (f" in {at}" if at else "")
        if probe.what.startswith("log matched"):
            cause += f": {line.strip()[:MAX_TEXT]}"
        fire = False
        with self.lock:
            if probe.fatal and self.fatal is None:
                self.fatal, fire = cause, True
            elif not probe.fatal and self.note is None:
                self.note = cause
        if fire and self.on_fatal is not None:
            self.on_fatal(cause)

    def raised(self, kind: str, message: str, frames: list[tuple[str, int]]) -> None:
        if kind in WRAPPERS:
            return
        at = where(frames)
        cause = kind + (f" in {at}" if at else "") + (f": {message.strip()[:MAX_TEXT]}" if message.strip() else "")
        with self.lock:
            if self.exception is None:
                self.exception = cause


@dataclass
class Worker:
    """torchrun's first failed worker: its rank, exit code (-N: signal N ended it) and pid."""
    rank: int = 0
    code: int | None = None
    pid: int = 0

    @property
    def signal(self) -> int | None:
        return -self.code if self.code is not None and self.code < 0 else None


class ProbeStream:
    """Reads one output stream (``feed`` bytes, then ``flush``) and tells its ``Probes`` what it saw.
    It only reads: the bytes are passed on by the caller unchanged."""

    def __init__(self, probes: Probes) -> None:
        self.probes = probes
        self.partial = b""
        self.frames: list[tuple[str, int]] = []  # of the traceback being read
        self.in_traceback = False
        self.lived_on = False  # the traceback being read is one the process printed and lived on
        self.previous = ""  # the last line outside a traceback
        self.root: Worker | None = None  # torchrun's root cause being read

    def feed(self, chunk: bytes) -> bytes:
        data = self.partial + chunk
        lines = re.split(rb"\r\n|\n|\r", data)
        self.partial = lines.pop()
        if len(self.partial) > MAX_LINE:
            lines.append(self.partial[:MAX_LINE])
            self.partial = b""
        for raw in lines:
            self.line(raw[:MAX_LINE].decode("utf-8", errors="replace"))
        return chunk

    def flush(self) -> bytes:
        if self.partial:
            self.line(self.partial[:MAX_LINE].decode("utf-8", errors="replace"))
        self.partial = b""
        return b""

    def line(self, text: str) -> None:
        text = PREFIX.sub("", text, count=1)
        stripped = text.strip()
        if stripped == HEADER:
            if self.previous not in CHAINED:  # a chain is as much an end as its first traceback was
                self.lived_on = bool(NOT_THE_END.match(self.previous))
            self.in_traceback, self.frames = True, []
            return
        if stripped:
            self.torchrun_root(stripped)
        if self.in_traceback:
            self.traceback_line(text, stripped)
            return
        if stripped:
            self.previous = stripped
        for probe in self.probes.probes:
            m = probe.search(stripped)
            if m:
                self.probes.found(probe, m, stripped, [])
                return

    def traceback_line(self, text: str, stripped: str) -> None:
        """A line inside a traceback: a frame, its source, or the exception line that ends it."""
        frame = FRAME.match(text)
        if frame:
            self.frames.append((frame[1], int(frame[2])))
            return
        if not stripped or text[:1].isspace() or stripped in CHAINED:
            return  # source lines, carets, blank lines between chained tracebacks
        self.in_traceback = False
        exc = EXCEPTION.match(stripped)
        for probe in self.probes.probes:  # "torch.OutOfMemoryError: CUDA out of memory ...": a probe, located
            m = probe.search(stripped)
            if m:
                self.probes.found(probe, m, stripped, self.frames)
                return
        if exc and not self.lived_on:
            self.probes.raised(exc[2], exc[3] or "", self.frames)
        self.previous = stripped

    def torchrun_root(self, line: str) -> None:
        """Read torchrun's "Root Cause (first observed failure)" record: the worker's rank, code and pid."""
        if line == ROOT_CAUSE:
            self.root = Worker()
            return
        if self.root is None:
            return
        rank, code = ROOT_RANK.match(line), ROOT_EXIT.match(line)
        if rank:
            self.root.rank = int(rank[1])
        elif code:
            self.root.code, self.root.pid = int(code[1]), int(code[2])
            with self.probes.lock:
                if self.probes.worker is None:
                    self.probes.worker = self.root
            self.root = None
        elif line.startswith("=") or line.startswith("Failures:"):
            self.root = None
