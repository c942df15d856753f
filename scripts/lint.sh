#!/usr/bin/env bash
# Lint and type-check: ruff (pyflakes, isort, pyupgrade; settings in pyproject.toml) on slurmrl/ and
# tests/, then mypy on slurmrl/. Both come with the `test` extra (scripts/install.sh). Exit status:
# non-zero when either finds something; both always run. Extra arguments go to ruff (say --fix,
# --statistics). Not yet run by scripts/test.sh.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
py=.venv/bin/python
[[ -x $py ]] || py=python3
rc=0
"$py" -m ruff check slurmrl tests "$@" || rc=1
"$py" -m mypy || rc=1
exit "$rc"
