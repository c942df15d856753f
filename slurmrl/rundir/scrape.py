"""``RUN_DIR/metrics/scrape/attempt-N/<target>.jsonl``: what the [collector] scraped from one
endpoint's Prometheus ``/metrics``, written and read here (the one format).

Compact and append-only: one JSON object per line, only what changed since the line before.

    {"start": T, "url": URL}                   the collector (re)started: forget keys and values
    {"t": T, "k": {"0": "name{labels}"}, "v": {"0": 1.0}}   a scrape: new keys, changed values
    {"t": T, "error": "..."}                   a scrape that failed (once per different error)
    {"t": T, "full": true}                     the size cap was reached: nothing more is written

Keys are a sample's name and labels as the endpoint wrote them. The reader rebuilds every scrape's
values (a value not written is the one before). A line cut short by a kill, or one that is not one
of these, is left out; a file that is not text is one line naming it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from slurmrl.errors import UserError
from slurmrl.rundir.read import MAX_DEPTH, json_depth, loads_json, open_file

MAX_LINE = 16 << 20  # one scrape line: a few KB; a longer one is not ours
MAX_KEY = 1000  # characters of one series key; a longer one is not a sample line


# ---- Prometheus text exposition ----------------------------------------------------------------
def _value(word: str) -> float | None:
    try:
        return float(word)  # also "NaN", "+Inf", "-Inf"
    except ValueError:
        return None


def parse_exposition(text: str) -> dict[str, float]:
    """``name{labels}`` -> value for every sample line of a Prometheus text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            end, quoted, i = -1, False, brace + 1
            while i < len(line):
                c = line[i]
                if c == "\\" and quoted:
                    i += 2
                    continue
                if c == '"':
                    quoted = not quoted
                elif c == "}" and not quoted:
                    end = i
                    break
                i += 1
            if end == -1:
                continue
            key, rest = line[:end + 1], line[end + 1:]
        else:
            key, _, rest = line.partition(" ")
        words = rest.split()
        value = _value(words[0]) if words else None
        if value is not None and len(key) <= MAX_KEY:
            out[key] = value
    return out


def split_key(key: str) -> tuple[str, dict[str, str]]:
    """``name{a="x",b="y"}`` -> (name, labels)."""
    name, _, rest = key.partition("{")
    labels: dict[str, str] = {}
    rest = rest.removesuffix("}")
    i = 0
    while i < len(rest):
        eq = rest.find("=", i)
        if eq == -1 or eq + 1 >= len(rest) or rest[eq + 1] != '"':
            break
        label, j, chars = rest[i:eq].strip().lstrip(","), eq + 2, []
        while j < len(rest) and rest[j] != '"':
            if rest[j] == "\\" and j + 1 < len(rest):
                j += 1
                chars.append({"n": "\n"}.get(rest[j], rest[j]))
            else:
                chars.append(rest[j])
            j += 1
        labels[label.strip()] = "".join(chars)
        i = j + 1
        while i < len(rest) and rest[i] in ", ":
            i += 1
    return name, labels


# ---- writing (the collector) -----------------------------------------------------------------------
class Writer:
    """Appends one target's scrapes to its file, only what changed; ``written`` counts bytes."""

    def __init__(self, path: Path, url: str, now: float):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.keys: dict[str, str] = {}
        self.last: dict[str, float] = {}
        self.error: str | None = None
        self.written = 0
        self._line({"start": now, "url": url})

    def _line(self, obj: dict) -> None:
        text = json.dumps(obj, separators=(",", ":")) + "\n"
        with self.path.open("a") as f:
            f.write(text)
        self.written += len(text.encode())

    def scrape(self, now: float, samples: dict[str, float]) -> None:
        new, changed = {}, {}
        for key, value in samples.items():
            idx = self.keys.get(key)
            if idx is None:
                idx = self.keys[key] = str(len(self.keys))
                new[idx] = key
            old = self.last.get(idx)
            if old is None or (old != value and not (math.isnan(old) and math.isnan(value))):
                changed[idx] = value  # NaN/Infinity as Python's json writes them
                self.last[idx] = value
        self.error = None
        line: dict = {"t": round(now, 3)}
        if new:
            line["k"] = new
        line["v"] = changed
        self._line(line)

    def failed(self, now: float, error: str) -> None:
        if error != self.error:
            self.error = error
            self._line({"t": round(now, 3), "error": error[:300]})

    def full(self, now: float) -> None:
        self._line({"t": round(now, 3), "full": True})


# ---- reading ---------------------------------------------------------------------------------------
@dataclass
class Scrapes:
    """One target's file, rebuilt: ``times`` of every scrape and each key's value at each of them
    (None before the key first appeared, or across a restart that did not report it)."""

    target: str
    times: list[float] = field(default_factory=list)
    values: dict[str, list[float | None]] = field(default_factory=dict)
    errors: list[tuple[float, str]] = field(default_factory=list)
    full: bool = False

    def series(self, key: str) -> list[tuple[float, float]]:
        """(time, value) for every scrape where ``key`` had a finite value."""
        return [(t, v) for t, v in zip(self.times, self.values.get(key, []))
                if v is not None and math.isfinite(v)]

    def keys(self, name: str) -> list[str]:
        """Every key of the metric ``name`` (any labels)."""
        return [k for k in self.values if k == name or k.startswith(name + "{")]


def read_scrapes(path: Path) -> Scrapes:
    """The file rebuilt (see the module's note); a missing file is an empty one."""
    path = Path(path)
    out = Scrapes(target=path.name.removesuffix(".jsonl"))
    keys: dict[str, str] = {}
    current: dict[str, float] = {}
    f = open_file(path, missing=None)
    if f is None:
        return out
    with f:
        for rec in _records(f, path):
            _add(out, rec, keys, current)
    return out


def _records(f: BinaryIO, path: Path) -> Iterator[dict]:
    """Each record of the file, in order: a line cut short by a kill, or one that is no record, is left
    out; a line that no scraper could have written (too long, not UTF-8, nested too deep) is a UserError."""
    for n, raw in enumerate(iter(lambda: f.readline(MAX_LINE + 1), b""), 1):
        if len(raw) > MAX_LINE:
            raise UserError(str(path), f"line {n} is longer than {MAX_LINE >> 20} MiB; it is not a scrape "
                                       "slurmrl wrote")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise UserError(str(path), f"is not UTF-8 text (line {n}); fix or remove it") from None
        if json_depth(line) > MAX_DEPTH:
            raise UserError(str(path), f"line {n} is nested more than {MAX_DEPTH} deep; it is not a scrape "
                                       "slurmrl wrote")
        try:
            rec = loads_json(line, path)
        except UserError:
            continue  # a line cut short by a kill
        if isinstance(rec, dict) and isinstance(rec.get("t", rec.get("start")), (int, float)):
            yield rec


def _add(out: Scrapes, rec: dict, keys: dict[str, str], current: dict[str, float]) -> None:
    """One record into ``out``: a start forgets the key table and the values (a restarted scraper), a
    full or error record is noted, a scrape adds its keys and a row of every column at its time."""
    if "start" in rec:
        keys.clear()
        current.clear()
        return
    t = float(rec["t"])
    if rec.get("full") is True:
        out.full = True
        return
    if isinstance(rec.get("error"), str):
        out.errors.append((t, rec["error"]))
        return
    new, vals = rec.get("k", {}), rec.get("v")
    if not isinstance(new, dict) or not isinstance(vals, dict):
        return
    keys.update({str(i): str(k) for i, k in new.items()})
    for i, v in vals.items():
        if i in keys and isinstance(v, (int, float)) and not isinstance(v, bool):
            current[keys[i]] = float(v)
    for k in current:
        if k not in out.values:
            out.values[k] = [None] * len(out.times)
    out.times.append(t)
    for k, column in out.values.items():
        column.append(current.get(k))
