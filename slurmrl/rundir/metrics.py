"""RUN_DIR/metrics/<role>.jsonl read back: the one reader (status, plot, sweep status, the
orchestrator's view of the trainer). One JSON object per line with a whole-number ``step``;
``slurmrl.runtime.metrics`` writes them.

What the runtime can write is accepted and kept as it is: null fields (no CUDA memory on a CPU
run), NaN and +-Infinity and huge numbers, an empty file, a last line cut short by a kill; an
integer beyond a float (which no reader could draw or format) is read as null, missing. A line
that is not a step's record (cut short, hand-edited, a step that is not a whole number) is left
out, as the runtime's own resume leaves it out (``Metrics.truncate_after``): the file is a log
that a kill may cut anywhere. A file that is not text (binary bytes, a folder, unreadable) is one
line naming the file."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.rundir.read import loads_json, open_file, read_bytes

MAX_STEP = 1 << 62
TAIL_BYTES = 1 << 16


@dataclass(frozen=True)
class Row:
    """One step's record; ``values`` as written (numbers may be NaN/inf, fields may be null)."""

    step: int
    values: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {**self.values, "step": self.step}

    def number(self, key: str) -> float | None:
        """The field as a finite number (None when it is absent, null, not a number, NaN or inf)."""
        value = self.values.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        try:
            value = float(value)
        except OverflowError:
            return None
        return value if math.isfinite(value) else None


def _row(line: str, path: Path) -> Row | None:
    """The line's record; None for a line that is not one (see the module's note)."""
    try:
        rec = loads_json(line, path)
    except UserError:
        return None
    if not isinstance(rec, dict):
        return None
    step = rec.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        return None
    return Row(step, {k: _in_a_float(v) for k, v in rec.items() if k != "step"})


def _in_a_float(value):
    """``value`` with every integer beyond a float (in tables and lists too) read as None."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            return None
        return value
    if isinstance(value, dict):
        return {k: _in_a_float(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_in_a_float(v) for v in value]
    return value


def _parse(text: str, path: Path) -> list[Row]:
    return [row for line in text.split("\n") if line.strip() and (row := _row(line, path)) is not None]


def _decode(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        # a multi-byte character cut by a kill at the very end is a partial last line, not binary
        if e.start >= len(data) - 3 and e.reason == "unexpected end of data":
            return data[:e.start].decode("utf-8")
        raise UserError(str(path), f"is not UTF-8 text (byte {e.start}); fix or remove it") from None


def read_rows(path: Path) -> list[Row]:
    """Every step's record in file order ([] when there is no file)."""
    data = read_bytes(path, missing=None)
    if data is None:
        return []
    return _parse(_decode(data, path), path)


def by_step(path: Path) -> dict[int, Row]:
    """Step -> its last record (a requeued step's later record overwrites the earlier one)."""
    return {r.step: r for r in read_rows(path)}


def last_row(path: Path, tail: int = TAIL_BYTES) -> Row | None:
    """The newest record, reading only the file's end (status polls it)."""
    f = open_file(path, missing=None)
    if f is None:
        return None
    try:
        with f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - tail))
            data = f.read(tail)
    except OSError as e:
        raise UserError(str(path), f"cannot be read: {e.strerror or e}") from None
    cut = size > tail
    if cut:  # the first line may start mid-record (and mid-character)
        nl = data.find(b"\n")
        data = data[nl + 1:] if nl >= 0 else b""
    rows = _parse(_decode(data, path), path)
    return rows[-1] if rows else None
