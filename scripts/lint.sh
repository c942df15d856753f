#!/usr/bin/env bash
# Lint and type-check: ruff (pyflakes, isort, pyupgrade, and a complexity ceiling of 12 per function in
# slurmrl/: McCabe C901; settings in pyproject.toml) on slurmrl/,
# tests/ and benchmarks/, then mypy on slurmrl/ (settings in pyproject.toml). Both come with the
# `test` extra (scripts/install.sh). Exit status: non-zero when either finds something; both always
# run. Extra arguments go to ruff (say --fix, --statistics). scripts/test.sh runs this first (also
# with --fast) and fails without running pytest when it fails.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
py=.venv/bin/python
[[ -x $py ]] || py=python3
rc=0
"$py" -m ruff check slurmrl tests benchmarks "$@" || rc=1
"$py" -m mypy || rc=1
exit "$rc"
