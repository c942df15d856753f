"""Special files (FIFOs, sockets, devices, links) made where a run dir's files go."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def make_special(path: Path, kind: str, tmp: Path) -> None:
    """Put a thing that is not a regular file at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        here = os.getcwd()
        os.chdir(path.parent)  # a relative name: a socket's path may be at most 107 bytes
        try:
            s.bind(path.name)
        finally:
            os.chdir(here)
            s.close()
    elif kind == "folder":
        path.mkdir()
        (path / "inside").write_text("x")
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind == "loop2":
        other = path.with_name(path.name + ".other")
        path.symlink_to(other.name)
        other.symlink_to(path.name)
    elif kind == "device":
        path.symlink_to("/dev/null")  # a character device (mknod needs more than a symlink)
    elif kind == "link-to-fifo":
        fifo = tmp / f"fifo-{abs(hash(str(path)))}"
        os.mkfifo(fifo)
        path.symlink_to(fifo)
    else:
        raise AssertionError(kind)
