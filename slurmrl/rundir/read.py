"""Reading a run-dir file: one place that turns what the filesystem and the bytes can do wrong
into one line naming the file (``UserError``, exit 2). A run dir lives on a shared filesystem
and is input like any other: it may be hand-edited, truncated, binary, or a folder."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

from slurmrl.errors import UserError

MAX_BYTES = 64 << 20  # no run-dir file slurmrl reads back is near this; a bigger one is not ours
_MISSING = object()


def read_bytes(path: Path, missing=_MISSING, limit: int = MAX_BYTES):
    """The file's bytes; ``missing`` when it does not exist (else an error naming it)."""
    path = Path(path)
    try:
        if path.is_dir():
            raise UserError(str(path), "is a folder; slurmrl expects a file here")
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        if missing is _MISSING:
            raise UserError(str(path), "does not exist") from None
        return missing
    except NotADirectoryError:
        if missing is _MISSING:
            raise UserError(str(path), "does not exist (a file stands where a folder should)") from None
        return missing
    except OSError as e:
        raise UserError(str(path), f"cannot be read: {e.strerror or e}") from None
    if len(data) > limit:
        raise UserError(str(path), f"is larger than {limit >> 20} MiB; it is not a file slurmrl wrote")
    return data


def read_text(path: Path, missing=_MISSING, limit: int = MAX_BYTES):
    """The file as UTF-8 text (``missing`` when it does not exist)."""
    data = read_bytes(path, missing, limit)
    if data is missing and missing is not _MISSING:
        return missing
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(str(path), f"is not UTF-8 text (byte {e.start}); fix or remove it") from None


def _constant(name: str) -> float:
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[name]


def loads_json(text: str, where: Path | str):
    """JSON as Python's json module writes it (NaN and Infinity included); else an error naming ``where``."""
    try:
        return json.loads(text, parse_constant=_constant)
    except RecursionError:
        raise UserError(str(where), "is nested too deeply to be a file slurmrl wrote") from None
    except ValueError as e:
        msg = getattr(e, "msg", None) or str(e)
        line = getattr(e, "lineno", None)
        raise UserError(str(where), f"is not valid JSON ({msg}{f' at line {line}' if line else ''}); "
                                    "fix or remove it") from None


def read_json(path: Path, missing=_MISSING):
    text = read_text(path, missing)
    if text is missing and missing is not _MISSING:
        return missing
    return loads_json(text, path)


def read_toml(path: Path, missing=_MISSING) -> dict:
    text = read_text(path, missing)
    if text is missing and missing is not _MISSING:
        return missing
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise UserError(str(path), "is nested too deeply to be a file slurmrl wrote") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(str(path), f"is not valid TOML ({e}); fix or remove it") from None


def kind(value) -> str:
    """How a wrong value is named in an error: 'a string', 'null', 'a list', ..."""
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "a table"}.get(type(value), type(value).__name__)
