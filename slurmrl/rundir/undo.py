"""Every change a verb makes to a run dir before the step that may still fail (sbatch), recorded so
that a failure puts the run dir back as it was: check, then write, then submit, and a refused
submit leaves no trace. Files are restored byte for byte, with their mode (or removed when they were not there),
moves are moved back, folders made here are removed when they are empty again, and what would have
been deleted is kept aside until :meth:`Changes.commit`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class Changes:
    def __init__(self) -> None:
        self._undo: list[tuple[str, Path, Path | tuple[bytes, int] | None]] = []
        self._trash: list[Path] = []

    def file(self, path: Path) -> None:
        """``path`` is about to be written (or made): remember what it holds now."""
        path = Path(path)
        kept = (path.read_bytes(), path.stat().st_mode & 0o7777) if path.is_file() and not path.is_symlink() else None
        self._undo.append(("file", path, kept))

    def folders(self, path: Path) -> None:
        """``path`` and its missing parents are about to be made: remember which are missing."""
        for p in reversed([Path(path), *Path(path).parents]):
            if not p.exists():
                self._undo.append(("folder", p, None))

    def rename(self, src: Path, dst: Path) -> None:
        """Move ``src`` to ``dst``; a ``dst`` in the way is set aside until commit (not deleted)."""
        src, dst = Path(src), Path(dst)
        if dst.exists() or dst.is_symlink():
            trash = dst.with_name(f".{dst.name}.replaced-{os.getpid()}")
            dst.rename(trash)
            self._undo.append(("move", trash, dst))
            self._trash.append(trash)
        src.rename(dst)
        self._undo.append(("move", dst, src))

    def rollback(self) -> None:
        """Put back everything recorded, newest first (each step on its own: one failure does not
        stop the others)."""
        for kind, path, before in reversed(self._undo):
            try:
                if kind == "file":
                    if before is None:
                        path.unlink(missing_ok=True)
                    else:
                        assert isinstance(before, tuple)
                        tmp = path.with_name(f".{path.name}.restore-{os.getpid()}")
                        tmp.write_bytes(before[0])
                        tmp.chmod(before[1])
                        tmp.replace(path)
                elif kind == "folder":
                    path.rmdir()  # only when empty again
                elif kind == "move":
                    assert isinstance(before, Path)
                    if path.exists() or path.is_symlink():
                        path.rename(before)
            except OSError:
                continue
        self._undo, self._trash = [], []

    def commit(self) -> None:
        """Keep the changes; what was set aside by :meth:`rename` is deleted now."""
        for trash in self._trash:
            if trash.is_dir() and not trash.is_symlink():
                shutil.rmtree(trash, ignore_errors=True)
            else:
                trash.unlink(missing_ok=True)
        self._undo, self._trash = [], []
