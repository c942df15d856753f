"""Ready files, ``RUN_DIR/ready/attempt-N/<component>.<task>``: one per task, written once the
task's own readiness check passed. Plain lines, so the batch shell reads them with ``read``: the
URL others reach the task at ("-" when it serves nothing), the number of tasks in its step (so
the script knows how many to wait for, even after a hand edit of --ntasks-per-node), and the pid
of the command the task runs ("-" when unknown)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from slurmrl.errors import UserError
from slurmrl.rundir.read import read_text

MAX_TASKS = 1 << 24


class Ready(NamedTuple):
    url: str | None
    ntasks: int
    pid: int | None


def write_ready(path: Path, url: str | None, ntasks: int, pid: int | None = None) -> None:
    path = Path(path)
    if url and any(c in url for c in "\r\n\0"):
        raise ValueError(f"a ready file's URL is one word: {url!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{url or '-'}\n{ntasks}\n{pid or '-'}\n")
    tmp.replace(path)


def _count(word: str) -> int | None:
    return int(word) if word.isascii() and word.isdigit() and len(word) <= 9 else None


def read_ready(path: Path) -> Ready:
    """(url or None, the step's task count, the command's pid or None) from a ready file.

    A file being written (empty, or only its first line) reads as not knowing the count (0) or
    the pid; a URL that is not one printable word is an error naming the file."""
    url, count, pid = ([ln.strip() for ln in read_text(path).splitlines()] + ["-", "0", "-"])[:3]
    if url not in ("", "-") and (not url.isprintable() or " " in url or "\t" in url):
        raise UserError(str(path), "its first line should be the task's URL (one word) or '-'")
    n = _count(count)
    return Ready(None if url in ("", "-") else url, n if n is not None and n <= MAX_TASKS else 0, _count(pid))
