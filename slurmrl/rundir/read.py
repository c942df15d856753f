"""Reading a file slurmrl reads back (a run dir's, a sweep dir's, a log, a scrape): the one place that
turns what the filesystem and the bytes can do wrong into one line naming the file (``UserError``,
exit 2). A run dir lives on a shared filesystem and is input like any other: it may be hand-edited,
truncated, binary, a folder, a named pipe, a socket, a device or a symbolic link that loops.

How a file is opened (:func:`open_file`, through the contract's bounded reader,
``slurmrl.contract.reader``, which the contract's own readers share), so that nothing can block or run away:
- ``stat`` first (it follows links; a loop is ``ELOOP``): anything but a regular file is refused
  before it is opened;
- then ``open`` with ``O_NONBLOCK`` (a FIFO swapped in after the ``stat`` cannot block the open)
  and ``O_NOCTTY``, and ``fstat`` of what was opened must again be a regular file;
- reads stop at a size cap (:data:`MAX_BYTES`, or the caller's);
- JSON is parsed with a nesting limit (:data:`MAX_DEPTH`), checked before the parser runs, so a
  line nested 200,000 deep is a refusal, never a ``RecursionError``.
A symbolic link to a regular file is read like the file."""

from __future__ import annotations

import errno
import json
import os
import stat
import tomllib
from pathlib import Path
from typing import BinaryIO

from slurmrl.contract.reader import MAX_BYTES, MAX_DEPTH, NotRegular, json_depth, non_finite, open_regular
from slurmrl.errors import UserError

_MISSING = object()
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _not_regular(path: Path, mode: int) -> UserError:
    what = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return UserError(str(path), f"is {what}; slurmrl expects a regular file here")


def _os_error(path: Path, e: OSError) -> UserError:
    if e.errno == errno.ELOOP:
        return UserError(str(path), "is a symbolic link that loops (or one chain too long); fix or remove it")
    reason = e.strerror or str(e)
    return UserError(str(path), f"cannot be read: {reason[:1].lower() + reason[1:]}")


def open_file(path: Path, missing=_MISSING) -> BinaryIO:
    """``path`` opened for reading bytes, once it is known to be a regular file (the contract's bounded
    reader, ``slurmrl.contract.reader.open_regular``); ``missing`` when it does not exist (else an error
    naming it)."""
    path = Path(path)
    try:
        return open_regular(path)
    except NotRegular as e:
        raise _not_regular(path, e.mode) from None
    except (FileNotFoundError, NotADirectoryError) as e:
        if missing is _MISSING:
            gone = " (a file stands where a folder should)" if isinstance(e, NotADirectoryError) else ""
            raise UserError(str(path), f"does not exist{gone}") from None
        return missing
    except OSError as e:
        raise _os_error(path, e) from None


def read_input(path: Path, limit: int):
    """A file the user hands slurmrl on the command line (a recipe), read once: a regular file as
    :func:`read_bytes` reads it, or a pipe the user opened on purpose (``slurmrl plan <(sed ... r.toml)``,
    ``/dev/stdin``), read until it ends or passes ``limit`` bytes (at most ``limit`` + 1 are returned);
    None when it does not exist. Anything else (a folder, a socket, a device, a loop) is one line."""
    path = Path(path)
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise _os_error(path, e) from None
    if not stat.S_ISFIFO(st.st_mode):
        return read_bytes(path, None, limit + 1, cut=True)
    try:
        with open(path, "rb", buffering=0) as f:
            chunks, size = [], 0
            while size <= limit and (chunk := f.read(min(1 << 16, limit + 1 - size))):
                chunks.append(chunk)
                size += len(chunk)
    except OSError as e:
        raise _os_error(path, e) from None
    return b"".join(chunks)


def check_file(path: Path, missing=_MISSING):
    """True when ``path`` is a regular file that opens (nothing is read); ``missing`` when it does not
    exist; else an error naming it."""
    f = open_file(path, missing)
    if f is missing:
        return missing
    f.close()
    return True


def read_bytes(path: Path, missing=_MISSING, limit: int = MAX_BYTES, offset: int = 0, cut: bool = False):
    """The file's bytes (from ``offset``; a negative one counts from the end); ``missing`` when it does
    not exist (else an error naming it). More than ``limit`` bytes is an error, or with ``cut`` the
    first ``limit`` of them (a chunk of a log that is read in pieces)."""
    f = open_file(path, missing)
    if f is missing:
        return missing
    try:
        with f:
            if offset:
                f.seek(offset if offset > 0 else max(0, os.fstat(f.fileno()).st_size + offset))
            data = f.read(limit + (not cut))
    except OSError as e:
        raise _os_error(Path(path), e) from None
    if len(data) > limit:
        raise UserError(str(path), f"is larger than {_size(limit)}; it is not a file slurmrl wrote")
    return data


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def decode(data: bytes, where: Path | str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(str(where), f"is not UTF-8 text (byte {e.start}); fix or remove it") from None


def read_text(path: Path, missing=_MISSING, limit: int = MAX_BYTES):
    """The file as UTF-8 text (``missing`` when it does not exist)."""
    data = read_bytes(path, missing, limit)
    if data is missing and missing is not _MISSING:
        return missing
    return decode(data, path)


def loads_json(text: str, where: Path | str, max_depth: int = MAX_DEPTH):
    """JSON as Python's json module writes it (NaN and Infinity included), nested at most ``max_depth``
    deep; else an error naming ``where``."""
    if json_depth(text, max_depth) > max_depth:
        raise UserError(str(where), f"is nested more than {max_depth} deep; it is not a file slurmrl wrote")
    try:
        return json.loads(text, parse_constant=non_finite)
    except RecursionError:
        raise UserError(str(where), "is nested too deeply to be a file slurmrl wrote") from None
    except ValueError as e:
        msg = getattr(e, "msg", None) or str(e)
        line = getattr(e, "lineno", None)
        raise UserError(str(where), f"is not valid JSON ({msg}{f' at line {line}' if line else ''}); "
                                    "fix or remove it") from None


def read_json(path: Path, missing=_MISSING, max_depth: int = MAX_DEPTH):
    text = read_text(path, missing)
    if text is missing and missing is not _MISSING:
        return missing
    return loads_json(text, path, max_depth)


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
