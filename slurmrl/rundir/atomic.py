"""Atomic writes of one run-dir file: a private temporary sibling, then one rename."""

from __future__ import annotations

import os
from pathlib import Path


def write_text(path: Path, text: str, umask: int | None = 0o077) -> None:
    """Write ``text`` to ``path`` all or nothing (``umask``: None keeps the process's own)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    old = os.umask(umask) if umask is not None else None
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    finally:
        if old is not None:
            os.umask(old)
