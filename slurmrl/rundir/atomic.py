"""The one way slurmrl writes a file (a run dir's records, a report, a chart, a sweep page): look at
the target and its folder first, then a private temporary sibling, then one rename.

- :func:`check_target`: the target is a regular file or absent (a link to one counts as one; a link
  to nothing as absent), never a folder, a named pipe, a socket, a device or a link that loops; the
  folders above it are folders (or absent: made on the way) and the nearest one there is writable.
  A refusal is one ``UserError`` naming the path, before anything is written.
- :func:`write_bytes` / :func:`write_text`: the bytes go to a temporary file of a fresh random name,
  opened with ``O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK`` (whatever stands at a name it picks, a
  link, a FIFO, a file, is never opened nor followed: the next name is tried), then renamed over the
  target. All or nothing: on any error the temporary file is removed and the target is as it was.
- :func:`make_parents`, :func:`missing_folders`, :func:`remove_empty`: the folders a write makes,
  and taking them away again after a refusal.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from slurmrl.errors import UserError

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISREG, "a file"))
_TRIES = 16  # temporary names tried: each one that is taken costs one more


def _what(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _reason(e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return "is a symbolic link that loops (or a chain too long); fix or remove it"
    reason = e.strerror or str(e)
    return f"cannot be written: {reason[:1].lower() + reason[1:]}"


def folder_problem(folder: Path, writable: bool = True) -> tuple[Path, str] | None:
    """None when ``folder`` is a folder (writable, with ``writable``) or absent below one (it will be
    made); else (the path at fault, what is wrong with it)."""
    folder = Path(folder)
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        return folder_problem(folder.parent, writable) if folder.parent != folder else None
    except NotADirectoryError:  # a file above it: named there
        return folder_problem(folder.parent, writable) or (folder, "cannot be made: a file stands where a folder should be")
    except OSError as e:
        return folder, _reason(e)
    if not stat.S_ISDIR(st.st_mode):
        return folder, f"is {_what(st.st_mode)}, where slurmrl writes a folder; move it away"
    if writable and not os.access(folder, os.W_OK | os.X_OK):
        return folder, "cannot be written: permission denied"
    return None


def check_folder(folder: Path) -> None:
    """``folder`` is a writable folder, or absent below one (it will be made): else one line naming it."""
    problem = folder_problem(folder)
    if problem:
        raise UserError(str(problem[0]), problem[1])


def check_target(path: Path) -> None:
    """``path`` may be written: see the module's note. Nothing is made or changed."""
    path = Path(path)
    check_folder(path.parent)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return  # absent, or a link to nothing: the rename puts a file there
    except OSError as e:
        raise UserError(str(path), _reason(e)) from None
    if not stat.S_ISREG(st.st_mode):
        raise UserError(str(path), f"is {_what(st.st_mode)}, where slurmrl writes a regular file; move it away")


def _open_temp(path: Path, perms: int) -> tuple[int, Path]:
    for _ in range(_TRIES):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            return os.open(tmp, flags, perms), tmp
        except FileExistsError:
            continue
    raise UserError(str(path), f"cannot be written: {_TRIES} temporary names beside it are all taken")


def write_bytes(path: Path, data: bytes, umask: int | None = 0o077, executable: bool = False) -> None:
    """Write ``data`` to ``path`` all or nothing (``umask``: None keeps the process's own, else the
    file's permissions are 0o666, or 0o777 when ``executable``, less it); a refusal is one line naming
    the path."""
    path = Path(path)
    check_target(path)
    make_parents(path)
    perms = 0o777 if executable else 0o666
    fd, tmp = _open_temp(path, perms & ~umask if umask is not None else perms)
    try:
        with os.fdopen(fd, "wb") as f:
            os.set_blocking(f.fileno(), True)
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(str(path), _reason(e)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str, umask: int | None = 0o077, executable: bool = False) -> None:
    """:func:`write_bytes` of ``text`` in UTF-8."""
    write_bytes(path, text.encode("utf-8"), umask, executable)


def make_parents(path: Path) -> list[Path]:
    """Create ``path``'s missing parent folders; returns those it created, outermost first (for
    :func:`remove_empty` when what follows is refused). One that cannot be made is one line naming it."""
    missing = [p for p in reversed(Path(path).parents) if not p.is_dir()]
    made: list[Path] = []
    for p in missing:
        try:
            p.mkdir()
        except FileExistsError:
            remove_empty(made)
            raise UserError(str(path), f"cannot be created: {p} exists and is not a folder") from None
        except OSError as e:
            remove_empty(made)
            raise UserError(str(path), f"cannot be created: {p}: {e.strerror or e}") from None
        made.append(p)
    return made


def missing_folders(path: Path) -> list[Path]:
    """``path`` and its parents that do not exist yet, outermost first: what a write would create, for
    :func:`remove_empty` after a refusal."""
    return [p for p in reversed([Path(path), *Path(path).parents]) if not p.exists()]


def remove_empty(made: list[Path]) -> None:
    """Remove the folders :func:`make_parents` created (innermost first), where they are still empty."""
    for p in reversed(made):
        try:
            p.rmdir()
        except FileNotFoundError:
            continue  # removed already (the run dir itself, say)
        except OSError:
            return
