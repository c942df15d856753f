"""Every change a verb makes to a run dir before the step that may still fail (sbatch), recorded so
that a failure puts the run dir back as it was: check, then write, then submit, and a refused
submit leaves no trace. Files are restored byte for byte, with their mode (or removed when they were not there),
moves are moved back, folders made here are removed when they are empty again, what a re-render
writes over (:meth:`Changes.tree`) is put back and what it added removed, and what would have been
deleted is kept aside until :meth:`Changes.commit`."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path


class Changes:
    def __init__(self) -> None:
        self._undo: list[tuple[str, Path, Path | tuple[bytes, int] | frozenset[str] | None]] = []
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

    def tree(self, root: Path, tops: Iterable[str]) -> None:
        """``root``'s entries named in ``tops`` (a render's files and folders: job.sbatch, plan.json,
        components/, a sweep's points) are about to be written over, removed or added to: every file
        under them is remembered, and whatever is under ``root`` afterwards that is not there now is
        removed on :meth:`rollback` (names only are listed elsewhere: a job's logs are not read)."""
        root = Path(root)
        self.folders(root)
        there = frozenset(str(p.relative_to(root)) for p in root.rglob("*")) if root.is_dir() else frozenset()
        self._undo.append(("added", root, there))
        for top in sorted(set(tops)):
            path = root / top
            for p in [path, *(sorted(path.rglob("*")) if path.is_dir() and not path.is_symlink() else [])]:
                if p.is_file() and not p.is_symlink():
                    self.file(p)

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
                        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # a folder a render removed
                        tmp = path.with_name(f".{path.name}.restore-{os.getpid()}")
                        tmp.write_bytes(before[0])
                        tmp.chmod(before[1])
                        tmp.replace(path)
                elif kind == "folder":
                    path.rmdir()  # only when empty again
                elif kind == "added":
                    assert isinstance(before, frozenset)
                    _remove_added(path, before)
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


def _remove_added(root: Path, there: frozenset[str]) -> None:
    """Remove what is under ``root`` and not in ``there`` (paths relative to it), deepest first."""
    if not root.is_dir():
        return
    for p in sorted(root.rglob("*"), key=lambda q: len(q.parts), reverse=True):
        if str(p.relative_to(root)) in there:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
