"""``python -m slurmrl.localcluster up|down|status|env|purge [--state-dir DIR]``."""

import subprocess
import sys

from . import SCRIPT


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return subprocess.call(["bash", str(SCRIPT), *argv])


if __name__ == "__main__":
    sys.exit(main())
