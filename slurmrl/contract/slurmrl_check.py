"""Is the slurmrl in the job's Python the one that rendered the job? Asked by the job's first step.

Every component of a job runs ``python -m slurmrl...`` in the job's Python, inside its container when
it has one. An image without slurmrl, or with another slurmrl than the one that wrote job.sbatch,
fails there only once the components start (``No module named slurmrl``, or a setting one side does
not know). So a job with a container runs this file first, as one short step in that container with
that Python, before any component, and ends at once with one line naming what is wrong::

    python3 RUN_DIR/slurmrl-check.py RUN_DIR/lock.toml IMAGE   (RunDir.SLURMRL_CHECK)

It compares what this interpreter can import (the ``slurmrl`` package, its distribution's version,
and its commit: the git checkout it is in, else the one pip recorded for ``pip install git+...@C``)
with ``[lock.slurmrl]`` of the run dir's lock.toml (``slurmrl.rundir.lockfile.slurmrl_state`` of
whoever rendered it). Where both sides know a commit, the commits must be equal; otherwise the
versions. Exit 0 with one line on stdout; exit 1 with one line on stderr.

It runs where slurmrl may be missing, so it is a script as well as a module: the render copies this
file into the run dir. Standard library only, and no import of slurmrl here.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11: main() names the version in one line
    tomllib = None  # type: ignore[assignment]

HOW = "put it in the image (docker/Dockerfile; docs/slurm.md, 'slurmrl in the job's image')"


def _git_commit(source: Path) -> str | None:
    """HEAD of the checkout whose top holds the package folder ``source`` (not of any repository above)."""
    if not (source.parent / ".git").exists():
        return None
    try:
        r = subprocess.run(["git", "-C", str(source.parent), "rev-parse", "HEAD"], capture_output=True, text=True,
                           timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = r.stdout.strip() if r.returncode == 0 else ""
    return commit or None


def _pip_commit() -> str | None:
    """The commit pip recorded for ``pip install git+URL@REV`` (PEP 610 direct_url.json), if any."""
    try:
        text = metadata.distribution("slurmrl").read_text("direct_url.json")
        return json.loads(text or "{}").get("vcs_info", {}).get("commit_id")
    except (metadata.PackageNotFoundError, ValueError, AttributeError):
        return None


def installed() -> dict | None:
    """{path, version, commit?} of the slurmrl this interpreter would import; None without one.
    Nothing is imported: the package is found, its version read from its metadata."""
    spec = importlib.util.find_spec("slurmrl")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(next(iter(spec.submodule_search_locations)))
    try:
        version = metadata.version("slurmrl")
    except metadata.PackageNotFoundError:
        version = "unknown (no package metadata)"
    out = {"path": str(source), "version": version}
    commit = _git_commit(source) or _pip_commit()
    if commit:
        out["commit"] = commit
    return out


def rendered_by(lock: Path) -> dict:
    """``[lock.slurmrl]`` of a run dir's lock.toml: {version, commit?, dirty?}; {} without one."""
    try:
        with lock.open("rb") as f:
            return dict(tomllib.load(f).get("lock", {}).get("slurmrl", {}))
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def describe(s: dict) -> str:
    return f"slurmrl {s.get('version', 'unknown')}" + (f" (commit {s['commit'][:12]})" if s.get("commit") else "")


def problem(found: dict | None, want: dict, where: str) -> str | None:
    """One line saying what is wrong, or None when ``found`` is what rendered the job (``want``)."""
    if found is None:
        return f"slurmrl is not installed in {where}: {HOW}"
    if found.get("commit") and want.get("commit"):
        same = found["commit"] == want["commit"]
    else:
        same = not want.get("version") or found["version"] == want["version"]
    if same:
        return None
    return (f"{where} has {describe(found)} at {found['path']}, but job.sbatch was rendered by {describe(want)}: "
            f"the job needs the same slurmrl; {HOW}")


def main(argv: list[str]) -> int:
    """``slurmrl-check.py LOCK [IMAGE]``: exit 0 or 1 with one line (see the module's docstring)."""
    where = f"the job's Python ({sys.executable}" + (f", container image {argv[1]})" if len(argv) > 1 else ")")
    if tomllib is None:
        print(f"{where} is Python {sys.version.split()[0]}; slurmrl needs 3.11 or later", file=sys.stderr)
        return 1
    want = rendered_by(Path(argv[0])) if argv else {}
    found = installed()
    line = problem(found, want, where)
    if line:
        print(line, file=sys.stderr)
        return 1
    assert found is not None
    print(f"{describe(found)} in {where}: the slurmrl that rendered the job")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
