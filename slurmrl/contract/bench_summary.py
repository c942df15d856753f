"""The benchmark's result: ``RUN_DIR/benchmark/summary.json``, written by the benchmark runner
(``slurmrl.runtime.bench``) after every point and read by `slurmrl status`, `plot` and `report` through
``slurmrl.rundir.benchmark`` (standard library only: the runner starts without pydantic).

    {"status": "done", "target": "http://n1:8000", "model": "m", "num_prompts": 200, "trace": null,
     "tool": "vllm", "mode": "grid", "planned_points": 4, "started": 1765071000, "finished": 1765071300,
     "points": [{"concurrency": 8, "input_len": 128, "output_len": 64, "output_throughput": 812.5, ...}],
     "error": null}

``mode`` is what the benchmark measured, named once here and written by the runner from its command
line (``BenchArgs.mode``): ``grid`` (each input length x output length x concurrency cap), ``trace``
(a timed trace replayed by vLLM's load generator: the trace's lengths, a point per cap or one without)
or ``sessions`` (multi-turn sessions replayed by aiperf; ``sessions`` counts them). A reader asks the
mode; none guesses it from missing lengths. A file written before the mode was is read by its ``tool``
and ``trace`` (the only place that does).

A point's number is kept only when it is finite and in its range (:data:`WHOLE`: whole numbers a float
holds exactly, a concurrency of 1 or more; measured figures: 0 or more, a share at most 1); the rest
(null, NaN, inf, an integer beyond a float, a concurrency of 0 or below, a negative latency) is read as
null, which `status`, `plot` and `report` show as missing ('-', no point drawn), never a crash. What is
not a number where a number belongs is a ``ContractError`` naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from slurmrl.contract.reader import TEXT, TOP, ContractError, Wrong, fields_of, kind, spec

GRID, TRACE, SESSIONS = "grid", "trace", "sessions"
MODES = (GRID, TRACE, SESSIONS)
STATUSES = ("running", "done", "failed", "stopped")
WHOLE = {"concurrency": 1, "input_len": 1, "output_len": 1, "failed": 0, "completed": 0, "num_prompts": 0}  # -> least
MEASURED = ("_ms", "_throughput", "_goodput", "_share")  # figures: 0 or more (a share: at most 1)
EXACT = 1 << 53  # whole numbers past this are not exact in a float


def in_range(key: str, value: Any) -> Any:
    """``value`` when it is a number in ``key``'s range (see the module's note), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if key in WHOLE:
        return value if isinstance(value, int) and WHOLE[key] <= value <= EXACT else None
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        return None
    top = 1.0 if key.endswith("_share") else math.inf
    return value if math.isfinite(number) and 0 <= number <= top else None


def _one_of(choices: tuple[str, ...]) -> Any:
    def read(value: Any, key: str) -> str:
        if value not in choices:
            shown = repr(value)[:40] if isinstance(value, str) else kind(value)
            raise Wrong(key, f"should be one of {', '.join(choices)}, not {shown}")
        return value
    return read


def _one_line(value: Any, key: str) -> str:
    text = TEXT(value, key)
    if "\n" in text or "\r" in text:
        raise Wrong(key, "should be one line of text, not several")
    return text


def _count(value: Any, key: str) -> int | None:
    """A whole number of 0 or more (past :data:`EXACT`: not known, None)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Wrong(key, "should be a whole number")
    return value if value <= EXACT else None


def _stamp(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Wrong(key, f"should be a time in seconds, not {kind(value)}")
    return value


def _point(p: Any, key: str) -> dict:
    if not isinstance(p, dict):
        raise Wrong(key, f"should be a table of numbers, not {kind(p)}")
    for name, value in p.items():  # a number out of range is missing; what is not a number is not ours
        if (name in WHOLE or name.endswith(MEASURED)) and value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float))):
            raise Wrong(f"{key}.{name}", f"should be a {'whole ' if name in WHOLE else ''}number, not {kind(value)}")
    errors = p.get("errors", [])
    if not isinstance(errors, list) or not all(isinstance(e, str) for e in errors):
        raise Wrong(f"{key}.errors", "should be a list of messages")
    return {name: in_range(name, value) if name in WHOLE or name.endswith(MEASURED) else value
            for name, value in p.items()}


def _points(value: Any, key: str) -> tuple[dict, ...]:
    if not isinstance(value, list):
        raise Wrong(key, f"should be a list, not {kind(value)}")
    return tuple(_point(p, f"{key}[{i}]") for i, p in enumerate(value))


@dataclass(frozen=True, kw_only=True)
class BenchSummary:
    """The benchmark's status, what it measured against which target, and one entry of numbers per point
    done (see the module's note)."""

    status: str = field(default="running", metadata=spec(_one_of(STATUSES)))
    target: str | None = field(default=None, metadata=spec(_one_line, optional=True))
    model: str | None = field(default=None, metadata=spec(TEXT, optional=True))
    num_prompts: int | None = field(default=None, metadata=spec(_count, optional=True))
    trace: str | None = field(default=None, metadata=spec(TEXT, optional=True))
    mode: str = GRID
    sessions: int | None = field(default=None, metadata=spec(_count, optional=True))
    planned_points: int | None = field(default=None, metadata=spec(_count, optional=True))
    started: float | None = field(default=None, metadata=spec(_stamp, optional=True))  # epoch seconds
    finished: float | None = field(default=None, metadata=spec(_stamp, optional=True))
    points: tuple[dict, ...] = field(default=(), metadata=spec(_points))
    error: str | None = field(default=None, metadata=spec(TEXT, optional=True))
    extra: dict = field(default_factory=dict)  # keys no field names, kept as written

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"a benchmark's mode is one of {', '.join(MODES)}, not {self.mode!r}")

    @property
    def tool(self) -> str:
        """The load generator: aiperf for the sessions, vLLM's ``vllm bench serve`` otherwise."""
        return "aiperf" if self.mode == SESSIONS else "vllm"

    @property
    def replay(self) -> bool:
        """A trace or sessions replay: the lengths are the trace's, not the benchmark's."""
        return self.mode != GRID

    def series_name(self, input_len: int | None, output_len: int | None) -> str:
        """How a chart and a table name a point's lengths: ``trace`` for a replay."""
        return "trace" if self.replay else f"in {input_len} / out {output_len}"

    def with_point(self, point: dict) -> BenchSummary:
        return replace(self, points=(*self.points, point))

    def to_json(self) -> dict:
        out = {"status": self.status, "target": self.target, "model": self.model, "num_prompts": self.num_prompts,
               "trace": self.trace, "tool": self.tool, "mode": self.mode,
               **({"sessions": self.sessions} if self.sessions is not None else {}),
               "planned_points": self.planned_points, "started": self.started, "finished": self.finished,
               "points": [dict(p) for p in self.points], "error": self.error}
        return {**out, **{k: v for k, v in self.extra.items() if k not in out}}

    @classmethod
    def from_json(cls, data: Any, source: str) -> BenchSummary:
        """The summary in ``data`` (decoded JSON) read from ``source``; a ``ContractError`` naming the key."""
        if not isinstance(data, dict):
            raise ContractError(source, TOP, f"should hold the benchmark's summary (a table), not {kind(data)}")
        try:
            values = fields_of(cls, data)
            mode = _one_of(MODES)(data["mode"], "mode") if "mode" in data else _legacy_mode(data)
        except Wrong as e:
            raise e.at(source) from None
        named = {*values, "mode", "tool", "extra"}
        return cls(**values, mode=mode, extra={k: v for k, v in data.items() if k not in named})


def _legacy_mode(data: dict) -> str:
    """The mode of a summary written before the mode was: aiperf replayed sessions, a trace was replayed."""
    if data.get("tool") == "aiperf":
        return SESSIONS
    return TRACE if isinstance(data.get("trace"), str) else GRID
