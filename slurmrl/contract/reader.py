"""The one reader kit of the files and lines between programs (standard library only): every reader in
contract/ reads its JSON through it, and ``slurmrl.rundir.read`` opens files through its bounded reader.

- :class:`ContractError`: the one error of a file or line that breaks its contract, one line naming the
  file (or message), the line number in a JSONL file where there is one, and the key (``samples[0].reward``):
  ``f.json: key 'samples[0].reward' must be a number, got bool``.
- The value readers (``reader(value, key) -> value``): :data:`TEXT`, :data:`WHOLE`, :data:`FLAG`,
  :func:`number`, :func:`or_null`, :func:`list_of`, :func:`table_of`; a reader refuses a value by raising
  :class:`Wrong` (the key and what is wrong), which :func:`parse` turns into the :class:`ContractError`.
- A frozen dataclass is read field by field (:func:`fields_of`): each field's metadata (:func:`spec`)
  holds its reader, and whether the key may be absent or null (``optional``).
- The bounded reader (:func:`open_regular`, :func:`read_bounded`): a file opened only when it is a
  regular one (a FIFO cannot block, a folder is refused before it is opened), read up to a cap; and
  JSON parsed with a nesting limit checked before the parser runs (:func:`json_depth`, :func:`loads`),
  so a line nested 200,000 deep is a refusal, never a ``RecursionError``.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, BinaryIO

Reader = Callable[[Any, str], Any]
MAX_BYTES = 64 << 20  # no file between programs is near this; a bigger one is not ours
MAX_DEPTH = 64  # JSON nesting: what slurmrl writes is a few levels deep
TOP = "(top)"  # the key of the whole document
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.S)
_BRACKET = re.compile(r"[\[\]{}]")


class ContractError(ValueError):
    """A file or line that breaks its contract: one line naming the file, the line (JSONL) and the key."""

    def __init__(self, source: str, key: str | None, what: str, line: int | None = None):
        self.source, self.key, self.what, self.line = str(source), key, " ".join(what.split()), line
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.source + (f" line {self.line}" if self.line is not None else "")
        return f"{where}: key {self.key!r} {self.what}" if self.key is not None else f"{where}: {self.what}"


class Wrong(Exception):
    """A value reader's refusal: the key (its path in the document) and what is wrong with it."""

    def __init__(self, key: str, what: str):
        super().__init__(key, what)
        self.key, self.what = key, what

    def at(self, source: str, line: int | None = None) -> ContractError:
        return ContractError(source, self.key, self.what, line)


def kind(value: Any) -> str:
    """How a wrong value is named: ``null``, or its Python type's name."""
    return "null" if value is None else type(value).__name__


def exactly(of: type, words: str) -> Reader:
    """A JSON scalar of exactly ``of`` (a boolean is not a whole number, nor the other way round)."""
    def read(value: Any, key: str) -> Any:
        if type(value) is not of:
            raise Wrong(key, f"must be {words}, got {kind(value)}")
        return value
    return read


TEXT, WHOLE, FLAG = exactly(str, "a string"), exactly(int, "a whole number"), exactly(bool, "true or false")


def number(value: Any, key: str) -> float:
    """A whole or decimal number (not a boolean), as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Wrong(key, f"must be a number, got {kind(value)}")
    return float(value)


def or_null(read: Reader) -> Reader:
    return lambda value, key: None if value is None else read(value, key)


def list_of(item: Reader) -> Reader:
    def read(value: Any, key: str) -> tuple:
        if not isinstance(value, (list, tuple)):
            raise Wrong(key, f"must be a list, got {kind(value)}")
        return tuple(item(x, f"{key}[{i}]") for i, x in enumerate(value))
    return read


def table_of(item: Reader) -> Reader:
    def read(value: Any, key: str) -> dict:
        if not isinstance(value, dict):
            raise Wrong(key, f"must be an object, got {kind(value)}")
        return {k: item(v, f"{key}.{k}") for k, v in value.items()}
    return read


def spec(read: Reader, optional: bool = False) -> dict:
    """A dataclass field's metadata: its reader, and whether its key may be absent or null."""
    return {"read": read, "optional": optional}


def child(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def fields_of(cls: Any, data: Any, where: str = "") -> dict[str, Any]:
    """``cls``'s fields from the JSON object ``data`` (at key ``where``), each through its reader: a key
    must be there unless its field is ``optional`` (then absent or null leaves the field's default)."""
    if not isinstance(data, dict):
        raise Wrong(where or TOP, f"must be an object, got {kind(data)}")
    values = {}
    for f in fields(cls):
        if "read" not in f.metadata:
            continue
        key, optional = child(where, f.name), f.metadata.get("optional", False)
        if f.name not in data or (optional and data[f.name] is None):
            if not optional:
                raise Wrong(key, "is missing")
            continue
        values[f.name] = f.metadata["read"](data[f.name], key)
    return values


def parse(cls: Any, data: Any, source: str, line: int | None = None) -> Any:
    """``cls`` from decoded JSON, or the :class:`ContractError` naming ``source``, ``line`` and the key."""
    try:
        return cls(**fields_of(cls, data))
    except Wrong as e:
        raise e.at(source, line) from None


# ---- the bounded reader ---------------------------------------------------------------------------
class NotRegular(Exception):
    """What stands at a path is not a regular file (``mode``: its stat mode)."""

    def __init__(self, path: Path | str, mode: int):
        super().__init__(str(path))
        self.path, self.mode = path, mode


def open_regular(path: Path | str, follow: bool = True) -> BinaryIO:
    """``path`` opened for reading bytes once it is known to be a regular file: ``stat`` first (a loop is
    ``ELOOP``; without ``follow`` a symbolic link is refused), then ``open`` with ``O_NONBLOCK`` (a FIFO
    swapped in after the ``stat`` cannot block) and ``fstat`` of what was opened. Raises
    :class:`NotRegular`, or the ``OSError`` as it comes (``FileNotFoundError`` for none)."""
    st = os.stat(path, follow_symlinks=follow)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular(path, st.st_mode)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # swapped between the stat and the open
            raise NotRegular(path, mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: Path | str, limit: int = MAX_BYTES, offset: int = 0, follow: bool = True) -> bytes:
    """At most ``limit`` bytes of the regular file at ``path``, from ``offset`` (a negative one counts from
    the end); raises as :func:`open_regular` does."""
    with open_regular(path, follow) as f:
        if offset:
            f.seek(offset if offset > 0 else max(0, os.fstat(f.fileno()).st_size + offset))
        return f.read(limit)


def json_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """How deep ``text``'s arrays and objects nest (brackets inside strings do not count); the count
    stops once it passes ``limit``."""
    if text.count("[") + text.count("{") <= limit:
        return text.count("[") + text.count("{")
    depth = deepest = 0
    for m in _BRACKET.finditer(_STRING.sub("", text)):
        depth += 1 if m.group() in "[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                break
    return deepest


def non_finite(name: str) -> float:
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[name]


def loads(text: str, source: str, line: int | None = None, max_depth: int = MAX_DEPTH) -> Any:
    """JSON as Python's json module writes it (NaN and Infinity included), nested at most ``max_depth``
    deep; else the :class:`ContractError` naming ``source`` (and ``line``)."""
    if json_depth(text, max_depth) > max_depth:
        raise ContractError(source, None, f"is nested more than {max_depth} deep; it is not a file slurmrl wrote", line)
    try:
        return json.loads(text, parse_constant=non_finite)
    except RecursionError:
        raise ContractError(source, None, "is nested too deeply to be a file slurmrl wrote", line) from None
    except ValueError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ContractError(source, None, f"not JSON: {first}", line) from None
