#!/usr/bin/env bash
# Run the whole test suite on a fresh machine: installs what it needs (scripts/install.sh),
# then runs pytest. The Slurm tests start (and stop) their own local cluster, which installs
# the Debian packages it needs. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/python -m pytest "$@"
