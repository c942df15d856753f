"""The exact versions installed in one of the project's virtual environments, as a pip constraints
file: what ``scripts/install.sh`` installs from (``-c scripts/constraints/ENV.txt``) so that a fresh
clone gets the versions the tests last passed with, whatever was released since.

    .venv/bin/python scripts/lock.py .venv > scripts/constraints/venv.txt   # update on purpose
    python3 scripts/lock.py --check .venv scripts/constraints/venv.txt     # exit 1 on a difference

Only the environment's own site-packages count (``.venv-sglang`` reads ``.venv``'s through a .pth),
and slurmrl itself (installed editable from this checkout) is left out. Standard library only: it runs
under any of the environments' interpreters or the system's."""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

SKIP = {"slurmrl"}  # this checkout, editable


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(venv: Path) -> dict[str, str]:
    """{canonical name: version} of the distributions in ``venv``'s own site-packages."""
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    found = {}
    for d in md.distributions(path=[purelib]):
        name = d.metadata["Name"]
        if name and canonical(name) not in SKIP:
            found[canonical(name)] = d.version
    return found


def read(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonical(name)] = version.strip()
    return pins


def differences(venv: Path, path: Path) -> list[str]:
    """Each locked distribution installed at another version (one not in the lock, installed by hand
    beside the project's, is not a difference; one locked but absent is the install's to add)."""
    have, want = installed(venv), read(path)
    return [f"{n}: installed {v}, locked {want[n]}" for n, v in sorted(have.items()) if n in want and want[n] != v]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--check"] and len(argv) == 3:
        diff = differences(Path(argv[1]), Path(argv[2]))
        print("\n".join(diff) if diff else f"{argv[1]} matches {argv[2]}")
        return 1 if diff else 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    print(f"# {argv[0]}: exact versions the tests last passed with (scripts/lock.py {argv[0]}); update on purpose")
    for name, version in sorted(installed(Path(argv[0])).items()):
        print(f"{name}=={version}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
