#!/usr/bin/env bash
# Run the whole test suite on a fresh machine: makes .venv, installs slurmrl with its test
# extras, then runs pytest. The Slurm tests start (and stop) their own local cluster, which
# installs the Debian packages it needs. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
exec .venv/bin/python -m pytest "$@"
